// Shared helpers of the dashboard's pages: data, formatting, generic tables, charts, SSE.
"use strict";
const T = (window.tandem = window.tandem || {});
T.charts = {};
T.updates = 0;
// A qualitative palette (Tableau 10 less its grey and pink): eight hues far apart
// (CIE76 distance 34 or more between any two), where the old sixteen held near-twins
// (blue and indigo, two teals). A chart with more lines than colours goes round again
// with a dash pattern, so no two of its lines look alike.
T.COLORS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
  "#9c755f"];
T.DASHES = [[], [7, 3], [2, 2], [9, 3, 2, 3]];
T.lineLook = (i) => ({ stroke: T.COLORS[i % T.COLORS.length],
  dash: T.DASHES[Math.floor(i / T.COLORS.length) % T.DASHES.length] });

// Words for a field or metric name, with its unit: the map is tandem/dashboard/labels.py
// (embedded in every page), the same for every page; the stored name stays in the
// tooltip. A dotted config key (train.micro_batch) is shown as the user writes it.
T.label = (name) => {
  const L = T.labelData || (T.labelData = JSON.parse(document.getElementById("labels").textContent));
  name = String(name);
  if (Object.hasOwn(L.labels, name)) return L.labels[name];
  if (name.includes(".") || name.includes(" ")) return name;  // a config key, or words
  // A mixture source's figure (task/<source>/<what>): the source's name, then the words.
  const task = T.catalogue && T.catalogue.names.TASK_PREFIX;
  const parts = name.split("/");
  if (task && name.startsWith(task) && parts.length > 2) return `${parts[1]} ${T.label(parts.slice(2).join("/"))}`;
  const tail = parts.pop();
  for (const [suffix, unit] of L.suffixes) {
    if (tail.endsWith(suffix) && tail.length > suffix.length) {
      const stem = tail.slice(0, -suffix.length).replaceAll("_", " ");
      return unit.startsWith("/") ? stem + unit : `${stem} (${unit})`;
    }
  }
  return tail.replaceAll("_", " ");
};

T.data = () => JSON.parse(document.getElementById("page-data").textContent);
// Non-finite numbers travel as strings (JSON has no NaN).
T.num = (v) => v === "NaN" ? NaN : v === "Infinity" ? Infinity : v === "-Infinity" ? -Infinity : v;
T.nums = (a) => a.map(T.num);

T.el = (tag, attrs, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const kid of kids.flat()) if (kid != null) e.append(kid instanceof Node ? kid : String(kid));
  return e;
};

T.fmt = (x) => {
  x = T.num(x);
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "∞" : "-∞";
  if (Number.isInteger(x) && Math.abs(x) < 1e15) return x.toLocaleString("en-US");
  const a = Math.abs(x);
  return a !== 0 && (a >= 1e6 || a < 1e-3) ? x.toExponential(3) : String(+x.toPrecision(5));
};
// Axis labels: 2.1G rather than 2,100,000,000.
T.short = (x) => {
  const a = Math.abs(x);
  if (a >= 1e12) return `${+(x / 1e12).toPrecision(3)}T`;
  if (a >= 1e9) return `${+(x / 1e9).toPrecision(3)}G`;
  if (a >= 1e6) return `${+(x / 1e6).toPrecision(3)}M`;
  if (a >= 1e4) return `${+(x / 1e3).toPrecision(3)}k`;
  return a !== 0 && a < 1e-3 ? x.toExponential(1) : String(+x.toPrecision(4));
};
T.when = (t) => t ? new Date(t * 1000).toLocaleString("sv-SE") : "–";
T.secs = (s) => {
  if (s === null || s === undefined) return "–";
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
};

// Any JSON value as HTML: objects as key/value tables, lists of objects as tables,
// lists of scalars as text, numbers formatted. New fields show up without changes here.
// Keys are shown in words (T.label); `raw`: as stored (config and plan keys).
T.kv = (value, raw) => {
  const key = (k) => raw ? { text: k } : { text: T.label(k), title: k };
  value = T.num(value);
  if (value === null || value === undefined) return T.el("span", { class: "muted", text: "–" });
  if (Array.isArray(value)) {
    if (value.length && value.every((v) => v && typeof v === "object" && !Array.isArray(v))) {
      const keys = [...new Set(value.flatMap(Object.keys))];
      return T.el("table", { class: "kv" }, T.el("tr", {}, keys.map((k) => T.el("th", key(k)))),
        value.map((row) => T.el("tr", {}, keys.map((k) => T.el("td", {}, T.kv(row[k], raw))))));
    }
    if (value.some((v) => v && typeof v === "object")) {
      return T.el("ul", { class: "plain" }, value.map((v) => T.el("li", {}, T.kv(v, raw))));
    }
    if (value.some((v) => typeof v === "string" && v.length > 24)) {
      return T.el("ul", { class: "plain" }, value.map((v) => T.el("li", { text: T.fmt(v) })));
    }
    return T.el("span", { text: value.length ? value.map(T.fmt).join(", ") : "none" });
  }
  if (typeof value === "object") {
    return T.el("table", { class: "kv" }, Object.entries(value).map(([k, v]) =>
      T.el("tr", {}, T.el("td", key(k)), T.el("td", {}, T.kv(v, raw)))));
  }
  return T.el("span", { text: T.fmt(value) });
};

T.table = (headers, rows, numeric) => T.el("table", { class: "list" },
  T.el("thead", {}, T.el("tr", {}, headers.map((h, i) =>
    T.el("th", { class: numeric && numeric[i] ? "num" : "", text: h })))),
  T.el("tbody", {}, rows.map((r) => T.el("tr", {}, r.map((c, i) =>
    T.el("td", { class: numeric && numeric[i] ? "num" : "" }, c instanceof Node ? c : T.fmt(c)))))));

T.card = (title, ...kids) => T.el("div", { class: "card" }, T.el("h3", { text: title }), ...kids);

// A series {step, value, time}: insert or replace a point, kept sorted by step.
T.upsert = (s, step, value, time) => {
  const n = s.step.length;
  if (!n || step > s.step[n - 1]) { s.step.push(step); s.value.push(value); if (s.time) s.time.push(time); return; }
  let lo = 0, hi = n;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (s.step[mid] < step) lo = mid + 1; else hi = mid; }
  if (s.step[lo] === step) { s.value[lo] = value; if (s.time) s.time[lo] = time; return; }
  s.step.splice(lo, 0, step); s.value.splice(lo, 0, value); if (s.time) s.time.splice(lo, 0, time);
};

// Keep a live series bounded like the server does: each bucket's first, min, max, last.
T.decimate = (s, limit) => {
  const n = s.step.length;
  if (n <= 2 * limit) return;
  const buckets = Math.floor(limit / 4), keep = [];
  for (let b = 0; b < buckets; b++) {
    const lo = Math.floor(b * n / buckets), hi = Math.floor((b + 1) * n / buckets);
    const chosen = new Set([lo, hi - 1]);
    let mn = -1, mx = -1, odd = -1;
    for (let i = lo; i < hi; i++) {
      const v = s.value[i];
      if (!Number.isFinite(v)) { if (odd < 0) odd = i; continue; }
      if (mn < 0 || v < s.value[mn]) mn = i;
      if (mx < 0 || v > s.value[mx]) mx = i;
    }
    for (const i of [mn, mx, odd]) if (i >= 0) chosen.add(i);
    keep.push(...[...chosen].sort((a, b) => a - b));
  }
  for (const k of ["step", "value", "time"]) if (s[k]) s[k] = keep.map((i) => s[k][i]);
};

T.series = (raw) => ({ step: raw.step.slice(), value: T.nums(raw.value),
  time: raw.time ? raw.time.slice() : null, n: raw.n });

// Lines with their own x values as one aligned table (null where a line has no point).
T.align = (lines, xOf) => {
  const xs = [...new Set(lines.flatMap((l) => xOf(l)))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const cols = lines.map((l) => {
    const col = new Array(xs.length).fill(null), x = xOf(l);
    for (let i = 0; i < x.length; i++) {
      const v = l.s.value[i];
      col[at.get(x[i])] = Number.isFinite(v) ? v : null;
    }
    return col;
  });
  return [xs, ...cols];
};

// Events as vertical markers (uPlot plugin); `events()` is read at each draw.
T.markers = (events) => ({ hooks: { draw: (u) => {
  const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
  ctx.save(); ctx.lineWidth = 1;
  for (const e of events()) {
    const x = u.valToPos(e.step, "x", true);
    if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
    // Red for what the diagnosis counts as instability; an outlier small on the run's own
    // scale (the server's `small`, the health finding's rule) is grey, as it says.
    ctx.strokeStyle = /nan|nonfinite|spike|explosion|rollback/i.test(e.kind) && !e.small ? "#c62828" : "#888";
    ctx.setLineDash([4, 3]); ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
  }
  ctx.restore();
} } });

// A chart of lines [{label, s}] in `parent`; redraw with chart.refresh().
T.Chart = class {
  constructor(id, parent, title, lines, opts) {
    this.id = id; this.lines = lines; this.opts = opts || {};
    this.xOf = this.opts.xOf || ((l) => l.s.step);
    this.box = T.el("div");
    parent.append(T.card(title, this.box));
    const width = Math.max(300, this.box.clientWidth || 440);
    const series = [{ label: this.opts.xLabel || "step" },
      ...lines.map((l, i) => this.style(l.shown || l.label, i))];
    this.u = new uPlot({ width, height: this.opts.height || 220, series,
      scales: { x: { time: false }, y: this.opts.log ? { distr: 3 } : {} },
      axes: [{ label: this.opts.xLabel || "step" },
        { size: 60, values: (u, vals) => vals.map((v) => v === null ? "" : T.short(v)) }],
      // a dashed line's legend swatch is dashed too
      legend: { live: true, markers: { dash: (u, i) => (u.series[i].dash || []).length ? "dashed" : "solid" } },
      plugins: this.opts.plugins || [] },
    T.align(lines, this.xOf), this.box);
    T.charts[id] = this;
    this.visible = true;
    new ResizeObserver(() => {
      const w = this.box.clientWidth;
      if (w && Math.abs(w - this.u.width) > 4) this.u.setSize({ width: w, height: this.u.height });
    }).observe(this.box);
    // A chart out of view is redrawn when it comes into view, not at every update.
    new IntersectionObserver((entries) => {
      this.visible = entries[entries.length - 1].isIntersecting;
      if (this.visible && this.dirty) this.refresh();
    }).observe(this.box);
  }
  // A line's look; `opts.stepped`: it holds each value until the next point.
  style(label, i) {
    return { label, ...T.lineLook(i), width: 1.5, spanGaps: true,
      points: { show: false }, ...(this.opts.stepped ? { paths: uPlot.paths.stepped({ align: 1 }) } : {}) };
  }
  add(line) {
    this.lines.push(line);
    this.u.addSeries(this.style(line.shown || line.label, this.lines.length - 1));
    this.draw();
  }
  // Redraw soon: updates that arrive together are drawn once, charts out of view later.
  refresh() {
    this.dirty = true;
    if (!this.visible) return;
    T.later(this);
  }
  draw() { this.dirty = false; this.u.setData(T.align(this.lines, this.xOf)); }
};
T.REDRAW_MS = 100;
T.pending = new Set();
// Anything with a draw() that changes what the page shows (a chart, a table, the
// header) is drawn at the next flush, all together: an update then costs the browser
// one frame (style, layout, paint, commit), not one for its text and one for its charts.
T.later = (job) => {
  T.pending.add(job);
  if (!T.flushTimer) T.flushTimer = setTimeout(T.flush, T.REDRAW_MS);
};
T.flush = () => {
  T.flushTimer = null;
  const charts = [...T.pending];
  T.pending.clear();
  for (const c of charts) c.draw();
  window.dispatchEvent(new CustomEvent("tandem:drawn", { detail: { at: Date.now() } }));
};

// Server-sent updates of this page: `handle(payload)` for each; reconnects resume
// from the last message's id (the cursor), so nothing is sent twice.
T.stream = (path, cursor, handle) => {
  const badge = document.getElementById("live");
  const enc = new URLSearchParams(cursor).toString();
  const url = "/stream" + path + (path.includes("?") ? "&" : "?") + "cursor=" + encodeURIComponent(enc);
  const source = new EventSource(url);
  source.addEventListener("open", () => { if (badge) { badge.textContent = "live"; badge.className = "conn on"; } });
  source.addEventListener("error", () => { if (badge) { badge.textContent = "reconnecting"; badge.className = "conn off"; } });
  source.addEventListener("update", (e) => {
    handle(JSON.parse(e.data));
    T.updates += 1;
    window.dispatchEvent(new CustomEvent("tandem:update", { detail: { at: Date.now() } }));
  });
  T.source = source;
  return source;
};

T.ready = () => { performance.mark("tandem:ready"); document.body.dataset.ready = "1"; };
