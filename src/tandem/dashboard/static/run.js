// The Run page: curves, phases, rank heatmaps, events, diagnosis, system, config; live.
"use strict";
(() => {
  const d = T.data(), run = d.run, LIMIT = d.points;
  // Metric names and groups come from the served catalogue (tandem.monitor.catalogue).
  const C = T.catalogue, M = C.names, G = C.groups;
  const TRAINING = new Set(G.TRAINING_CURVES);
  const STEP_NAMES = new Set(G.STEP_TIMES);
  // Under time/ but not a part of each step: a checkpoint's wait, calibration's running
  // cost, the wire time the link predicts. Each gets its own chart, not the phase split.
  const NOT_PHASES = new Set(G.NOT_PHASES);
  const HEAT_NAMES = Object.keys(d.heatmaps).concat(G.HEATMAPS);
  const unit = (name) => (C.metrics[name] || {}).unit;
  T.run = run; T.events = d.events; T.segments = d.segments; T.lines = {}; T.heat = {};

  // A mixture's figures of each source (task/<source>/<what>): <what>, or "" for others.
  const taskWhat = (name) => name.startsWith(M.TASK_PREFIX) ? name.split("/").slice(2).join("/") : "";
  const TASK_LOSSES = new Set([M.TASK_LOSS, M.TASK_EVAL_LOSS].map(taskWhat));
  // Where a metric is drawn: [chart id, section, title]; null: only in a heatmap.
  const place = (name) => {
    const what = taskWhat(name);
    if (TASK_LOSSES.has(what)) return ["task-loss", "curves", "loss by task (training, evaluation)"];
    if (what && what !== taskWhat(M.TASK_SHARE)) return ["task-metrics", "curves", "evaluation metrics by task"];
    if (name === M.LOSS || (!name.includes("/") && !TRAINING.has(name) && name.includes(M.LOSS))) return ["loss", "curves", "loss"];
    if (name === M.SAMPLES_PER_S) return ["throughput", "curves", `throughput (${unit(M.SAMPLES_PER_S)})`];
    if (name === M.TOKENS_PER_S) return ["tokens", "curves", `throughput (${unit(M.TOKENS_PER_S)})`];
    if (STEP_NAMES.has(name)) return ["steptime", "phases", `step time (${unit(M.TIME_STEP)}): mean, p50, max`];
    if (name.startsWith(M.TIME_PREFIX) && !NOT_PHASES.has(name)) return ["phases", "phases", "step-time split: seconds per step by phase"];
    if (name === M.STRAGGLER_SCORE) return null;
    if (name.startsWith(M.SYS_PREFIX) || name.startsWith(M.MEM_PREFIX)) return [name, "system", T.label(name)];
    if (!name.includes("/") || TRAINING.has(name)) return [name, "curves", T.label(name)];
    return [name, "other", T.label(name)];
  };
  const order = (name) => name === M.LOSS ? 0 : ((!name.includes("/") && !TRAINING.has(name)) || taskWhat(name)) ? 1
    : name === M.SAMPLES_PER_S ? 2 : name === M.TOKENS_PER_S ? 3 : 4;
  const withMarkers = new Set(["loss", "throughput", "tokens"]);

  const lineFor = (name, rank, raw) => {
    T.lines[name] = T.lines[name] || {};
    if (T.lines[name][rank]) return T.lines[name][rank];
    const where = place(name);
    if (!where) return null;
    const s = raw ? T.series(raw) : { step: [], value: [], time: [], n: 0 };
    // `label` names the line (as stored); `shown` is what its legend says.
    const line = { label: rank === "-1" ? name : `${name} rank ${rank}`, s, name, rank,
      shown: rank === "-1" ? T.label(name) : `${T.label(name)}, rank ${rank}` };
    T.lines[name][rank] = line;
    const [id, section, title] = where;
    if (T.charts[id]) T.charts[id].add(line);
    else new T.Chart(id, document.getElementById(section), title, [line],
      { plugins: withMarkers.has(id) ? [T.markers(() => T.events)] : [] });
    return line;
  };

  // ---------------------------------------------------------------- heatmaps
  const color = (name, v, lo, hi) => {
    if (!Number.isFinite(v)) return "#9e9e9e";
    if (name === M.STRAGGLER_SCORE) {
      const t = Math.max(-1, Math.min(1, (v - 1) / 0.5));
      return t >= 0 ? `rgb(255,${Math.round(255 - 200 * t)},${Math.round(255 - 220 * t)})`
        : `rgb(${Math.round(255 + 160 * t)},${Math.round(255 + 100 * t)},255)`;
    }
    const t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
    return `rgb(${Math.round(235 - 190 * t)},${Math.round(242 - 150 * t)},${Math.round(255 - 90 * t)})`;
  };
  const drawHeat = (name) => {
    const h = T.heat[name], box = h.box;
    const finite = h.values.flat().filter(Number.isFinite);
    const lo = Math.min(...finite), hi = Math.max(...finite);
    const cv = h.canvas, ctx = cv.getContext("2d");
    cv.width = Math.max(1, h.step.length); cv.height = h.ranks.length;
    const rowPx = Math.max(4, Math.min(18, Math.floor(400 / Math.max(1, h.ranks.length))));
    cv.style.height = `${rowPx * h.ranks.length}px`;
    h.labels.replaceChildren(...h.ranks.map((r) => T.el("div", { style: `height:${rowPx}px;line-height:${rowPx}px`,
      text: rowPx >= 12 ? `rank ${r}` : "" })));
    h.ranks.forEach((_, r) => h.values[r].forEach((v, c) => {
      ctx.fillStyle = color(name, v, lo, hi); ctx.fillRect(c, r, 1, 1);
    }));
    h.scale.textContent = `${h.ranks.length} ranks × ${h.step.length} windows (each cell: the ` +
      `largest value in its windows) · min ${T.fmt(lo)} · max ${T.fmt(hi)}` +
      (name === M.STRAGGLER_SCORE ? " · white = the median rank, red = slower" : "");
    box.dataset.columns = h.step.length;
  };
  const heatmap = (name, raw) => {
    const box = T.el("div", { class: "heatmap", id: `heat-${name}` });
    const canvas = T.el("canvas"), tip = T.el("div", { class: "tip" });
    const scale = T.el("div", { class: "legend-scale" }), labels = T.el("div", { class: "ranks" });
    box.append(T.el("h3", { text: `${T.label(name)} by rank and window`, title: name }),
      T.el("div", { class: "heatrow" }, labels, canvas), tip, scale);
    document.getElementById("heatmaps").append(box);
    const h = T.heat[name] = { step: raw.step.slice(), ranks: raw.ranks.slice(),
      values: raw.values.map(T.nums), box, canvas, tip, scale, labels };
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const c = Math.floor((e.clientX - r.left) / r.width * h.step.length);
      const k = Math.floor((e.clientY - r.top) / r.height * h.ranks.length);
      if (c < 0 || k < 0 || c >= h.step.length || k >= h.ranks.length) return;
      tip.style.display = "block"; tip.style.left = `${e.clientX - r.left + 12}px`;
      tip.style.top = `${e.clientY - r.top + 30}px`;
      tip.textContent = `rank ${h.ranks[k]} · step ${h.step[c]} · ${T.fmt(h.values[k][c])}`;
    });
    canvas.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    new IntersectionObserver((entries) => {
      h.visible = entries[entries.length - 1].isIntersecting;
      if (h.visible && h.dirty) { h.dirty = false; drawHeat(name); }
    }).observe(box);
    drawHeat(name);
  };
  const drawVisibleHeat = () => {
    for (const [name, h] of Object.entries(T.heat)) if (h.dirty && h.visible !== false) { h.dirty = false; drawHeat(name); }
  };
  const heatPut = (name, step, rank, value) => {
    let h = T.heat[name];
    if (!h) { heatmap(name, { step: [], ranks: [], values: [] }); h = T.heat[name]; }
    let k = h.ranks.indexOf(rank);
    if (k < 0) {
      h.ranks.push(rank); h.values.push(new Array(h.step.length).fill(NaN)); k = h.ranks.length - 1;
      const order = h.ranks.map((r, i) => [r, i]).sort((a, b) => a[0] - b[0]);
      h.ranks = order.map((o) => o[0]); h.values = order.map((o) => h.values[o[1]]);
      k = h.ranks.indexOf(rank);
    }
    const n = h.step.length;
    if (!n || step > h.step[n - 1]) { h.step.push(step); h.values.forEach((row) => row.push(NaN)); }
    const c = h.step.lastIndexOf(step);
    if (c < 0) return; // an old window inside a merged bucket
    h.values[k][c] = value;
    if (h.step.length > 2 * d.columns) { // merge neighbour columns, keeping the larger value
      const keep = (a, b) => !Number.isFinite(a) || !Number.isFinite(b) ? NaN : Math.max(a, b);
      h.step = h.step.filter((_, i) => i % 2 === 1 || i === h.step.length - 1);
      h.values = h.values.map((row) => row.reduce((out, v, i) => {
        if (i % 2 === 0 && i + 1 < row.length) out.push(keep(v, row[i + 1]));
        else if (i % 2 === 0) out.push(v);
        return out;
      }, []));
    }
  };

  // ---------------------------------------------------------------- text parts
  const header = () => {
    const env = run.env || {}, last = T.lines[M.LOSS] && T.lines[M.LOSS]["-1"];
    const steps = Object.values(T.lines).flatMap((byRank) => Object.values(byRank))
      .map((l) => l.s.step[l.s.step.length - 1] || 0);
    const rate = T.lines[M.SAMPLES_PER_S] && T.lines[M.SAMPLES_PER_S]["-1"];
    const end = run.finished || Date.now() / 1000;
    const live = run.status === C.runs.RUNNING && Date.now() / 1000 - T.lastActivity < 300;
    const head = document.getElementById("head");
    head.replaceChildren(
      T.el("h1", {}, run.name, T.el("span", { class: `badge ${run.status}`, id: "status", text: run.status }),
        live ? T.el("span", { class: "badge live", text: "live" }) : null,
        T.el("small", { text: run.run_id })),
      T.el("div", { class: "muted" }, [`started ${T.when(run.started)}`, `${env.world_size ?? "?"} × ${env.device ?? "?"}`,
        `host ${env.host ?? "?"}`, `torch ${env.torch ?? "?"}`, env.git_commit ? `commit ${String(env.git_commit).slice(0, 10)}` : null]
        .filter(Boolean).join(" · ")),
      T.el("div", { class: "kpis" }, [
        ["step", Math.max(0, ...steps)],
        ["loss", last ? last.s.value[last.s.value.length - 1] : null],
        ["samples/s", rate ? rate.s.value[rate.s.value.length - 1] : null],
        ["duration", T.secs(end - run.started)]].map(([k, v]) =>
        T.el("div", {}, T.el("b", { id: `kpi-${k.replace("/", "")}`, text: typeof v === "string" ? v : T.fmt(v) }), T.el("span", { text: k })))));
  };
  const EVENTS_SHOWN = 200;
  const eventsTable = () => {
    const box = document.getElementById("events");
    if (!T.events.length) { box.replaceChildren(T.el("p", { class: "muted", text: "no events" })); return; }
    // The latest EVENTS_SHOWN only: the table is rebuilt on each new event, and a long
    // run's thousands of rows made each rebuild cost more than the page's charts.
    const shown = T.events.slice(-EVENTS_SHOWN), hidden = T.events.length - shown.length;
    const table = T.table(["step", "rank", "kind", "message", "value", "threshold", "time"],
      shown.map((e) => [e.step, e.rank, e.small ? `${e.kind} (small)` : e.kind, e.message, e.value, e.threshold, T.when(e.time)]),
      [true, true, false, false, true, true, false]);
    if (!hidden) { box.replaceChildren(table); return; }
    box.replaceChildren(T.el("p", { class: "muted", text: `the latest ${EVENTS_SHOWN} of ${T.events.length.toLocaleString("en-US")} events, all in the run store` }), table);
  };
  const segmentsTable = () => {
    const box = document.getElementById("segments"), segs = T.segments;
    if (segs.length < 2) { box.replaceChildren(T.el("p", { class: "muted", text: "one segment: the run was never resumed or restarted" })); return; }
    box.replaceChildren(T.table(["#", "from step", "to step", "started", "why"],
      segs.map((s) => [s.index, s.start_step, s.end_step, T.when(s.started), s.cause]), [true, true, true, false, false]));
  };
  const configCards = () => {
    const box = document.getElementById("config");
    // Config and plan keys as the user writes them; the rest in words.
    box.replaceChildren(...[["Config", run.config, true], ["Plan", run.plan, true],
      ["Environment", run.env], ["Summary", run.summary]].filter(([, v]) => v)
      .map(([k, v, raw]) => T.card(k, T.kv(v, raw))));
  };

  // Each finding's fields, whatever they are: kind and severity head it, the rest below.
  const renderFindings = (found) => {
    const box = document.getElementById("findings");
    box.className = "";
    const when = T.el("p", { class: "muted", id: "diagnosed", text: `${over(found)}, ${new Date().toLocaleTimeString("sv-SE")}; asked again while rows arrive, after ${Math.round(T.rediagnoseMs(found) / 1000)} s` });
    if (!found.findings.length) { box.replaceChildren(T.el("p", { class: "muted", text: "nothing to diagnose yet: no timing figures recorded" }), when); return; }
    box.replaceChildren(...found.findings.map((f) => T.el("div", { class: `finding ${f.severity}`, "data-kind": f.kind },
      T.el("h3", {}, f.kind, T.el("small", { text: f.severity })),
      f.message ? T.el("div", { text: f.message }) : null,
      Object.entries(f).filter(([k]) => !["kind", "severity", "message"].includes(k)).map(([k, v]) =>
        T.el("div", { class: "field", "data-field": k }, T.el("b", { text: T.label(k), title: k }), T.kv(v))))), when);
  };
  const over = (found) => found.latest
    ? `over this live run's latest ${found.rows.toLocaleString("en-US")} rows, steps ${found.latest[0]}-${found.latest[1]} (the whole run once it ends)`
    : `over the run's ${found.rows.toLocaleString("en-US")} rows`;
  // The server diagnoses a long live run on its latest rows (view_run.LIVE_ROWS), a
  // finished one on every row. It is asked again while new rows arrive, not on each
  // update, and no sooner than its last computation's CPU time (cost_s) over
  // DIAGNOSIS_SHARE: a page keeps the server's diagnoses under 0.1% of a core (0.2 s:
  // every 200 s; a run beside two busy cores loses about what the server takes from them).
  const REDIAGNOSE_MS = 30000, DIAGNOSIS_SHARE = 0.001;
  T.rediagnoseMs = (found) => Math.max(REDIAGNOSE_MS, 1000 * ((found && found.cost_s) || 0) / DIAGNOSIS_SHARE);
  let diagnosedAt = 0, dirty = false, waitMs = REDIAGNOSE_MS;
  const diagnose = async () => {
    diagnosedAt = Date.now(); dirty = false;
    const res = await fetch(`/api/run/${encodeURIComponent(run.run_id)}/findings`);
    if (res.ok) { T.findings = await res.json(); waitMs = T.rediagnoseMs(T.findings); renderFindings(T.findings); }
  };

  // ---------------------------------------------------------------- build
  T.lastActivity = Math.max(run.started, d.last_time || 0);
  const names = Object.keys(d.series).sort((a, b) => order(a) - order(b) || a.localeCompare(b));
  for (const name of names) {
    for (const [rank, raw] of Object.entries(d.series[name])) {
      if (!(HEAT_NAMES.includes(name) && rank !== "-1")) lineFor(name, rank, raw);
    }
  }
  for (const [name, raw] of Object.entries(d.heatmaps)) heatmap(name, raw);
  if (!Object.keys(d.heatmaps).length) document.getElementById("ranks-section").hidden = true;
  if (!document.getElementById("other").children.length) document.getElementById("other-section").hidden = true;
  if (!names.length) document.getElementById("curves").append(T.el("p", { class: "muted", text: "no metrics recorded yet" }));
  header(); eventsTable(); segmentsTable(); configCards();
  if (d.compression) {  // server-rendered (escaped) SVG and tables: `tandem compress`'s trade-off
    const box = document.getElementById("compression");
    box.innerHTML = d.compression; box.hidden = false;
  }
  T.ready();
  diagnose();

  // ---------------------------------------------------------------- live
  // What an update changes is drawn at the next flush, with the charts (`T.later`).
  const jobs = { header: { draw: header }, events: { draw: eventsTable },
    segments: { draw: segmentsTable }, config: { draw: configCards },
    heat: { draw: drawVisibleHeat } };
  const apply = (msg) => {
    const touched = new Set(), heat = new Set();
    for (const [step, rank, name, v, time] of msg.rows || []) {
      const value = T.num(v);
      T.lastActivity = Math.max(T.lastActivity, time);
      if (rank >= 0 && (HEAT_NAMES.includes(name))) { heatPut(name, step, rank, value); heat.add(name); }
      const have = T.lines[name] || {};
      const key = String(rank);
      if (rank >= 0 && (have["-1"] || HEAT_NAMES.includes(name))) continue;
      if (rank >= 0 && !have[key] && Object.keys(have).length >= 16) continue;
      const line = have[key] || lineFor(name, key, null);
      if (!line) continue;
      T.upsert(line.s, step, value, time);
      touched.add(line);
    }
    const charts = new Set();
    for (const line of touched) { T.decimate(line.s, LIMIT); charts.add(place(line.name)[0]); }
    for (const id of charts) T.charts[id].refresh();
    for (const name of heat) T.heat[name].dirty = true;
    if (heat.size) T.later(jobs.heat);
    if (msg.events) {
      T.events.push(...msg.events);
      for (const e of msg.events) {
        if (["resume", "restart"].includes(String(e.kind).toLowerCase())) {
          const prev = T.segments[T.segments.length - 1];
          if (prev && prev.index > 0 && prev.start_step === e.step) prev.cause += `; ${e.message}`;
          else T.segments.push({ index: T.segments.length, start_step: e.step, end_step: e.step, started: e.time, cause: `${e.kind}: ${e.message}` });
        }
      }
      T.later(jobs.events);
      for (const id of withMarkers) if (T.charts[id]) T.charts[id].refresh();
    }
    const last = T.segments[T.segments.length - 1];
    if (last && msg.rows && msg.rows.length) last.end_step = Math.max(last.end_step, ...msg.rows.map((r) => r[0]));
    if (msg.events || (msg.rows && T.segments.length > 1)) T.later(jobs.segments);
    if (msg.run) {
      Object.assign(run, msg.run); T.later(jobs.config);
      if (run.status !== C.runs.RUNNING && T.findings && T.findings.latest) diagnose();  // now the whole run
    }
    T.later(jobs.header);
    if (msg.rows) dirty = true;
    if (dirty && Date.now() - diagnosedAt > waitMs) diagnose();
  };
  T.stream(`/run/${encodeURIComponent(run.run_id)}`, d.cursor, apply);
  setInterval(() => { if (dirty && Date.now() - diagnosedAt > waitMs) diagnose(); }, 5000);
})();
