// The Tuner page: a session's trials (baseline, controls, candidates), their 95%
// intervals against the plan, and the decision.
"use strict";
(() => {
  const d = T.data();
  const select = document.getElementById("session");
  T.tuner = d;
  for (const s of d.sessions) {
    const opt = T.el("option", { value: s.run_id, text: `${s.name} · ${T.when(s.started)} · ${s.status}` });
    if (d.session && s.run_id === d.session.run_id) opt.selected = true;
    select.append(opt);
  }
  select.addEventListener("change", () => { location.href = `/tuner?session=${encodeURIComponent(select.value)}`; });
  if (!d.session) {
    document.getElementById("head").append(T.el("p", { class: "muted", text: "no tune session in this store yet (tandem tune records one; it appears here when it starts)" }));
    for (const id of ["decision", "intervals", "trials"]) document.getElementById(id).previousElementSibling.hidden = true;
    T.stream("/tuner", d.cursor, () => location.reload());
    T.ready(); return;
  }
  const trials = new Map(d.trials.map((t) => [t.trial_id, t]));
  const session = d.session;
  const minGain = ((session.config || {}).tune || {}).min_gain;
  // What a gain had to clear: the session's noise floor (1 + min_gain, or the placebo's
  // bias when it showed one) once recorded, else 1 + min_gain.
  const recordedFloor = T.num(((session.summary || {}).noise || {}).floor);
  const floor = Number.isFinite(recordedFloor) ? recordedFloor : minGain !== undefined ? 1 + minGain : undefined;
  const interval = (x, suffix) => x && typeof x === "object" && "estimate" in x
    ? `${T.fmt(x.estimate)}${suffix || ""} [${T.fmt(x.low)}, ${T.fmt(x.high)}]` : "–";

  const head = () => document.getElementById("head").replaceChildren(
    T.el("h1", {}, session.name, T.el("span", { class: `badge ${session.status}`, text: session.status }),
      T.el("small", { text: session.run_id })),
    T.el("div", { class: "muted", text: `started ${T.when(session.started)} · script ${(session.config || {}).script ?? "?"} · ${(session.config || {}).nproc ?? "?"} processes` + (floor !== undefined ? ` · adopt when the lower bound of the speed-up exceeds ${T.fmt(floor)}x` + (Number.isFinite(recordedFloor) && minGain !== undefined ? ` (the noise floor; at least ${T.fmt(1 + minGain)}x)` : "") : "") }),
    // its trial and control runs are named after it, and kept off the Runs page's default
    T.el("div", {}, T.el("a", { id: "session-runs", href: `/runs?kind=all&q=${encodeURIComponent(session.run_id)}`, text: "this session's runs (its trials and controls)" })));
  const decision = () => {
    const s = session.summary, box = document.getElementById("decision");
    if (!s) { box.replaceChildren(T.el("p", { class: "muted", text: session.status === T.catalogue.runs.RUNNING ? "the session is still running" : "no decision recorded" })); return; }
    box.replaceChildren(T.el("div", { class: "grid" },
      T.card("Chosen plan changes", Object.keys(s.chosen || {}).length ? T.kv(s.chosen, true) : T.el("p", { text: "keep the current plan" })),
      T.card("Speed-up vs the starting plan [95% CI]", T.el("p", { text: s.speedup ? interval(s.speedup, "x") : (s.decision ?? "–") })),
      T.card("Evidence and the rest", T.kv(Object.fromEntries(Object.entries(s).filter(([k]) => !["chosen", "speedup"].includes(k)))))));
  };
  // Ratio intervals as an SVG: one row per trial with a ratio, lines at 1 and the floor.
  // (An end cut at the axis is marked ‹ or ›; the table gives every interval in full.)
  const intervals = () => {
    const box = document.getElementById("intervals");
    const rows = [...trials.values()].filter((t) => t.figures && t.figures.ratio && "low" in t.figures.ratio);
    if (!rows.length) {
      // A hyper-parameter search ranks its trials by time to target, one run each; an
      // interval exists only once paired runs confirm the best one.
      const hp = ((session.config || {}).tune || {}).mode === "hparams";
      const why = (session.summary || {}).decision;
      box.replaceChildren(T.el("p", { class: "muted", text: hp
        ? "a hyper-parameter search: trials are ranked by their time to target in one run each (the table below); an interval comes only from paired runs that confirm the best trial" + (why ? `. ${why}` : "")
        : "no trial measured against the plan yet" }));
      return;
    }
    const lows = rows.map((t) => T.num(t.figures.ratio.low)), highs = rows.map((t) => T.num(t.figures.ratio.high));
    // A log axis (ratios), spanning the estimates and the floor with room either side: an
    // interval of a run or two can reach 0.01x-100x and would squash every estimate
    // into a corner, so its ends are cut at the axis and marked.
    const ests = rows.map((t) => T.num(t.figures.ratio.estimate)).filter((v) => v > 0);
    const finite = (vs) => vs.filter((v) => Number.isFinite(v) && v > 0);
    const lo = Math.max(Math.min(0.9, ...finite(lows)), Math.min(0.9, ...ests) / 2);
    const hi = Math.min(Math.max(1.1, (floor || 1) * 1.05, ...finite(highs)), Math.max(1.1, floor || 1, ...ests) * 2);
    const W = 820, L = 260, R = 90, H = 24 * rows.length + 40;
    const clip = (v) => Math.min(hi, Math.max(lo, Number.isFinite(v) && v > 0 ? v : lo));
    const x = (v) => L + Math.log(clip(v) / lo) / Math.log(hi / lo) * (W - L - R);
    const ns = "http://www.w3.org/2000/svg", svg = document.createElementNS(ns, "svg");
    const add = (tag, attrs, text) => { const e = document.createElementNS(ns, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text) e.textContent = text; svg.append(e); return e; };
    svg.setAttribute("class", "intervals"); svg.setAttribute("viewBox", `0 0 ${W} ${H}`); svg.setAttribute("width", W);
    // 1x labelled under the axis, the floor above it: close together they must not overlap
    for (const [v, label, dash, y] of [[1, "1x", "", H - 4], ...(floor !== undefined ? [[floor, `floor ${T.fmt(floor)}x`, "4 3", 10]] : [])]) {
      add("line", { x1: x(v), x2: x(v), y1: 14, y2: H - 18, stroke: "#888", "stroke-dasharray": dash });
      add("text", { x: x(v) - 10, y }, label);
    }
    rows.forEach((t, i) => {
      const y = 26 + 24 * i, r = t.figures.ratio, c = t.status === "adopted" ? "#2e7d32" : t.figures.kind === "control" ? "#2f6fd6" : "#d6552f";
      add("text", { x: 4, y: y + 4 }, `${t.trial_id} ${t.figures.label || ""} (${t.status})`.slice(0, 40));
      add("line", { x1: x(T.num(r.low)), x2: x(T.num(r.high)), y1: y, y2: y, stroke: c, "stroke-width": 3 });
      if (!(T.num(r.low) >= lo)) add("text", { x: L - 10, y: y + 4, fill: c }, "‹");
      if (!(T.num(r.high) <= hi)) add("text", { x: W - R - 2, y: y + 4, fill: c }, "›");
      add("circle", { cx: x(T.num(r.estimate)), cy: y, r: 4, fill: c, "data-trial": t.trial_id });
      add("text", { x: W - R + 6, y: y + 4 }, `${T.fmt(r.estimate)}x`);
    });
    box.replaceChildren(svg);
  };
  const table = () => {
    const rows = [...trials.values()];
    const box = document.getElementById("trials");
    box.replaceChildren(T.el("table", { class: "list" },
      T.el("thead", {}, T.el("tr", {}, ["#", "kind", "trial", "status", "changes", "samples/s [95% CI]", "predicted", "measured vs plan [95% CI]", "decision", "figures"].map((h) => T.el("th", { text: h })))),
      T.el("tbody", {}, rows.map((t) => {
        const f = t.figures || {}, rest = Object.fromEntries(Object.entries(f).filter(([k]) => !["label", "kind", "samples_per_s", "ratio", "predicted", "measured"].includes(k)));
        const more = Object.keys(rest).length ? T.el("details", {}, T.el("summary", { text: `${Object.keys(rest).length} more` }), T.kv(rest)) : "";
        return T.el("tr", { class: `${f.kind || ""} ${t.status}`, "data-trial": t.trial_id },
          T.el("td", { text: t.trial_id }), T.el("td", { text: f.kind ?? "–" }), T.el("td", { text: f.label ?? "–" }),
          T.el("td", { text: t.status }), T.el("td", {}, Object.keys(t.plan || {}).length ? T.kv(t.plan, true) : "–"),
          T.el("td", { class: "num", text: interval(f.samples_per_s) }),
          // the gain the measurements predicted for a candidate, beside the one its pairs measured
          T.el("td", { class: "num", text: Number.isFinite(T.num(f.predicted)) ? `${T.fmt(f.predicted)}x` : "–" }),
          T.el("td", { class: "num", text: interval(f.ratio, "x") }),
          T.el("td", { text: t.decision ?? "" }), T.el("td", {}, more));
      }))));
  };
  const render = () => { head(); decision(); intervals(); table(); };
  render();
  T.ready();
  T.stream(`/tuner?session=${encodeURIComponent(session.run_id)}`, d.cursor, (msg) => {
    for (const t of msg.trials || []) trials.set(t.trial_id, t);
    if (msg.session) Object.assign(session, msg.session);
    render();
  });
})();
