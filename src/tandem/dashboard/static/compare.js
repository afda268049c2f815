// The Compare page: runs overlaid against step or wall time; figures side by side.
"use strict";
(() => {
  const d = T.data();
  const xsel = document.getElementById("xaxis"), every = document.getElementById("all-config");
  T.compare = d;
  const runs = d.runs.map((r) => ({ ...r, lines: Object.fromEntries(
    Object.entries(r.series).map(([n, raw]) => [n, T.series(raw)])) }));
  T.runsCompared = runs;
  // A run is labelled by its name, and by its id too where two runs share a name.
  const names = runs.map((r) => r.name);
  for (const r of runs) r.label = names.filter((n) => n === r.name).length > 1 ? `${r.name} (${r.run_id})` : r.name;

  const build = () => {
    const box = document.getElementById("curves");
    box.replaceChildren();
    for (const key of Object.keys(T.charts)) delete T.charts[key];
    const byTime = xsel.value === "time";
    for (const name of d.names) {
      const lines = runs.filter((r) => r.lines[name]).map((r) => ({ label: r.label, s: r.lines[name], run: r }));
      if (!lines.length) continue;
      const xOf = byTime ? (l) => l.s.time.map((t) => +(t - l.run.started).toFixed(3)) : (l) => l.s.step;
      new T.Chart(name, box, T.label(name), lines, { xOf, xLabel: byTime ? "seconds since start" : "step" });
    }
  };
  const table = (rows, onlyDiff) => {
    const shown = rows.filter((r) => !onlyDiff || r.differs);
    if (!shown.length) return T.el("p", { class: "muted", text: "no differences" });
    return T.el("table", { class: "list" },
      T.el("thead", {}, T.el("tr", {}, T.el("th", { text: "" }), runs.map((r) => T.el("th", { text: r.label, title: r.run_id })))),
      T.el("tbody", {}, shown.map((row) => T.el("tr", { class: row.differs ? "differs" : "", "data-key": row.key },
        T.el("td", { text: T.label(row.key), title: row.key }), row.values.map((v) => T.el("td", { class: "num" },
          v !== null && typeof v === "object" ? T.kv(v) : T.fmt(v)))))));
  };
  const tables = () => {
    document.getElementById("summary").replaceChildren(table(d.summary, false));
    document.getElementById("config").replaceChildren(table(d.config, !every.checked));
  };
  if (runs.length < 2) document.getElementById("legend").append(T.el("p", { class: "muted",
    text: "select two or more runs on the Runs page to compare them" }));
  xsel.addEventListener("change", build);
  every.addEventListener("change", tables);
  build(); tables();
  T.ready();
  if (runs.length) {
    T.stream(`/compare?runs=${runs.map((r) => encodeURIComponent(r.run_id)).join(",")}`, d.cursor, (msg) => {
      const touched = new Set();
      for (const [rid, rows] of Object.entries(msg.rows || {})) {
        const r = runs.find((x) => x.run_id === rid);
        for (const [step, , name, v, time] of rows) {
          if (!d.names.includes(name)) continue;
          const s = r.lines[name] = r.lines[name] || { step: [], value: [], time: [] };
          T.upsert(s, step, T.num(v), time); T.decimate(s, 2000); touched.add(name);
        }
      }
      for (const name of touched) if (T.charts[name]) T.charts[name].refresh(); else build();
    });
  }
})();
