// The Scheduler page: the jobs, the queue, the processes each job held over time, the
// resizes and preemptions, and the policy's latest decision.
"use strict";
(() => {
  const d = T.data();
  const jobs = new Map(d.jobs.map((j) => [j.job_id, j]));
  const key = (r) => `${r.job_id}/${r.attempt}`;
  const resizes = new Map(d.resizes.map((r) => [key(r), r]));
  const state = { present: d.scheduler, queue: d.queue, decision: d.decision, service: d.service };
  // The store's clock, not the browser's: ages and open allocations run to "now" there.
  let serverNow = d.now, receivedAt = Date.now();
  const now = () => serverNow + (Date.now() - receivedAt) / 1000;
  T.sched = { jobs, resizes, state };

  const S = T.catalogue.jobs, HOLDING = [S.RUNNING, S.STOPPING];
  const open = (a) => a.ended === null || a.ended === undefined;
  const heldAt = (j, t) => j.attempts.reduce(
    (n, a) => n + (a.launched <= t && (open(a) || t < a.ended) ? a.procs : 0), 0);
  const link = (j) => j.run_id ? T.el("a", { href: `/run/${encodeURIComponent(j.run_id)}`, text: j.run_name })
    : T.el("span", { class: "muted", text: j.run_name, title: "no run by this name in the store yet" });
  const range = (j) => `${j.min_procs}:${j.max_procs}`;
  const cell = (field, content, numeric) => T.el("td", { "data-field": field, class: numeric ? "num" : "" }, content);
  const waitingSince = (j) => Math.max(j.submitted, ...j.attempts.filter((a) => !open(a)).map((a) => a.ended));

  const head = () => {
    const box = document.getElementById("head");
    if (!state.present) {
      box.replaceChildren(T.el("p", { class: "muted", text: "no scheduler has used this store yet: " +
        "its tables appear with the first `tandem submit` or `tandem scheduler` on this store" }));
      return;
    }
    const all = [...jobs.values()], count = (s) => all.filter((j) => j.state === s).length;
    const held = all.filter((j) => HOLDING.includes(j.state)).reduce((n, j) => n + j.procs, 0);
    const kpi = (value, label, id) => T.el("div", { id }, T.el("b", { text: T.fmt(value) }), T.el("span", { text: label }));
    box.replaceChildren(
      T.el("div", { class: "muted", text: state.service.service ? `service: ${state.service.service}`
        : "no scheduler service has run on this store yet (`tandem scheduler` starts one)" }),
      T.el("div", { class: "kpis" }, kpi(all.length, "jobs", "kpi-jobs"), kpi(count(S.QUEUED), S.QUEUED, "kpi-queued"),
        kpi(count(S.RUNNING) + count(S.STOPPING), S.RUNNING, "kpi-running"), kpi(held, "processes held now", "kpi-held"),
        kpi(count(S.COMPLETED), S.COMPLETED, "kpi-completed"), kpi(count(S.FAILED), S.FAILED, "kpi-failed")));
  };

  const jobsTable = () => {
    const rows = [...jobs.values()].sort((a, b) => a.seq - b.seq);
    const t = now();
    const headers = ["job", "state", "procs min:max", "held", "priority", "submitted", "started", "finished",
      "JCT / age", "attempts", "run", "note"];
    const numeric = new Set(["held", "priority", "attempts"]);
    document.getElementById("jobs").replaceChildren(T.el("table", { class: "list", id: "jobs-table" },
      T.el("thead", {}, T.el("tr", {}, headers.map((h) => T.el("th", { class: numeric.has(h) ? "num" : "", text: h })))),
      T.el("tbody", {}, rows.map((j) => {
        const between = j.state === S.STOPPING ? ` → ${j.target_procs || 0} (${j.stop_reason})` : "";
        const jct = j.jct !== null ? T.el("span", { text: T.secs(j.jct) })
          : T.el("span", { class: "muted", text: `age ${T.secs(t - j.submitted)}` });
        return T.el("tr", { "data-job": j.job_id },
          cell("job", [T.el("b", { text: j.name }), T.el("div", { class: "muted", text: j.job_id })]),
          cell("state", [T.el("span", { class: `badge ${j.state}`, text: j.state }), between,
            j.cancel_requested && ![S.CANCELLED, S.COMPLETED, S.FAILED].includes(j.state) ? " (cancel requested)" : null]),
          cell("procs", range(j)), cell("held", T.fmt(j.procs), true), cell("priority", T.fmt(j.priority), true),
          cell("submitted", T.when(j.submitted)), cell("started", T.when(j.started)), cell("finished", T.when(j.finished)),
          cell("jct", jct), cell("attempts", T.fmt(j.attempts.length), true), cell("run", link(j)),
          cell("note", j.message || ""));
      }))));
  };

  const queueTable = () => {
    const box = document.getElementById("queue");
    const waiting = state.queue.map((id) => jobs.get(id)).filter(Boolean);
    if (!waiting.length) { box.replaceChildren(T.el("p", { class: "muted", text: "no job is waiting" })); return; }
    const t = now(), plan = (state.decision && state.decision.changes) || {};
    box.replaceChildren(T.el("p", { class: "muted", text: "in submission order; the policy " +
      `(${state.decision ? state.decision.policy : "none yet"}) chooses which of them start` }),
    T.el("table", { class: "list", id: "queue-table" },
      T.el("thead", {}, T.el("tr", {}, ["#", "job", "procs min:max", "priority", "submitted", "waiting", "attempts so far",
        "latest decision"].map((h) => T.el("th", { text: h })))),
      T.el("tbody", {}, waiting.map((j, i) => T.el("tr", { "data-job": j.job_id },
        cell("position", String(i + 1)), cell("job", `${j.job_id} ${j.name}`), cell("procs", range(j)),
        cell("priority", T.fmt(j.priority)), cell("submitted", T.when(j.submitted)),
        cell("waiting", T.secs(t - waitingSince(j))), cell("attempts", T.fmt(j.attempts.length)),
        cell("decision", plan[j.job_id] || ""))))));
  };

  // Each job's processes at every moment an allocation changed (an attempt launched or
  // ended), from its first launch to its last end (to now while it holds some), and the
  // sum over jobs; x in seconds since the first submission.
  const allocationLines = () => {
    const ran = [...jobs.values()].filter((j) => j.attempts.length).sort((a, b) => a.seq - b.seq);
    const origin = Math.min(...[...jobs.values()].map((j) => j.submitted));
    const times = new Set(ran.flatMap((j) => j.attempts.flatMap((a) => open(a) ? [a.launched] : [a.launched, a.ended])));
    if (ran.some((j) => j.attempts.some(open))) times.add(Math.max(now(), ...times));
    const xs = [...times].sort((a, b) => a - b), x = xs.map((t) => t - origin);
    const lines = ran.map((j) => {
      const first = Math.min(...j.attempts.map((a) => a.launched));
      const last = j.attempts.some(open) ? Infinity : Math.max(...j.attempts.map((a) => a.ended));
      return { label: `${j.job_id} ${j.name}`, job: j.job_id,
        s: { step: x, value: xs.map((t) => t < first || t > last ? null : heldAt(j, t)) } };
    });
    const total = { label: "all jobs", s: { step: x, value: xs.map((t) => ran.reduce((n, j) => n + heldAt(j, t), 0)) } };
    return [total, ...lines];
  };
  const allocations = () => {
    const box = document.getElementById("allocations");
    const lines = allocationLines();
    const chart = T.charts.allocations;
    if (lines.length === 1) {
      delete T.charts.allocations;
      box.replaceChildren(T.el("p", { class: "muted", text: "no job has been launched yet" }));
      return;
    }
    if (chart && chart.lines.map((l) => l.label).join("\n") === lines.map((l) => l.label).join("\n")) {
      chart.lines.forEach((l, i) => { l.s = lines[i].s; });
      chart.refresh();
      return;
    }
    box.replaceChildren();
    new T.Chart("allocations", box, "processes held (stepped: a size holds until the next change)", lines,
      { xLabel: "seconds since the first submission", stepped: true, height: 260 });
  };

  const resizeTable = () => {
    const box = document.getElementById("resizes");
    const rows = [...resizes.values()].sort((a, b) => a.decided - b.decided || (key(a) > key(b) ? 1 : -1));
    if (!rows.length) { box.replaceChildren(T.el("p", { class: "muted", text: "no resize or preemption yet" })); return; }
    const batch = (r) => r.from_batch === r.to_batch ? "" : ` (batch ${T.fmt(r.from_batch)} → ${T.fmt(r.to_batch)})`;
    box.replaceChildren(T.el("table", { class: "list", id: "resizes-table" },
      T.el("thead", {}, T.el("tr", {}, ["kind", "job", "procs", "decided", "stopped after", "training again after",
        "step stopped → resumed", "steps redone", "record"].map((h) => T.el("th", { text: h })))),
      T.el("tbody", {}, rows.map((r) => T.el("tr", { "data-key": key(r), class: r.kind },
        cell("kind", r.kind), cell("job", `${r.job_id} (attempt ${r.attempt})`),
        cell("procs", `${r.from_procs} → ${r.to_procs}${batch(r)}`), cell("decided", T.when(r.decided)),
        cell("stop", T.secs(r.stop_s)), cell("latency", T.secs(r.to_training_s)),
        cell("steps", `${T.fmt(r.stopped_step)} → ${T.fmt(r.resumed_step)}`), cell("redone", T.fmt(r.steps_redone)),
        cell("closed", r.closed ? "complete" : "in progress"))))));
  };

  const decisionCard = () => {
    const box = document.getElementById("decision"), dec = state.decision;
    if (!dec) { box.replaceChildren(T.el("p", { class: "muted", text: "the policy has not decided yet" })); return; }
    box.replaceChildren(T.el("div", { class: "grid" },
      T.card(`#${dec.seq} of ${dec.count} · ${T.when(dec.time)} · policy ${dec.policy} · backend ${dec.backend}`,
        T.el("div", { id: "decision-changes" }, Object.keys(dec.changes).length ? T.kv(dec.changes) : T.el("p", { text: "no change" }))),
      T.card("Processes per job", T.el("div", { id: "decision-allocations" }, T.kv(dec.allocations)))));
  };

  const render = () => {
    head();
    document.getElementById("content").hidden = !state.present;
    if (!state.present) return;
    jobsTable(); queueTable(); allocations(); resizeTable(); decisionCard();
  };
  render();
  T.ready();
  T.stream("/sched", d.cursor, (msg) => {
    serverNow = msg.now; receivedAt = Date.now();
    state.present = state.present || msg.scheduler;
    for (const j of msg.jobs || []) jobs.set(j.job_id, j);
    for (const r of msg.resizes || []) resizes.set(key(r), r);
    if (msg.queue) state.queue = msg.queue;
    if ("decision" in msg) state.decision = msg.decision;
    if (msg.service) state.service = msg.service;
    render();
  });
  // Ages, waits and the allocations of running jobs move on between updates.
  setInterval(() => { if ([...jobs.values()].some((j) => [S.QUEUED, ...HOLDING].includes(j.state))) render(); }, 5000);
})();
