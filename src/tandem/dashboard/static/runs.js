// The Runs page: the user's runs (by default; the tuner's trials and controls, or every
// run, on request), newest first; filter, search, select several to compare.
"use strict";
(() => {
  const d = T.data();
  const runs = new Map(d.runs.map((r) => [r.run_id, r]));
  const chosen = new Set();
  T.runs = runs;
  const search = document.getElementById("search"), status = document.getElementById("status");
  const button = document.getElementById("compare"), kind = document.getElementById("kind");
  const params = new URLSearchParams(location.search);
  search.value = params.get("q") || "";
  // The kind is chosen by the server (a tune session's dozens of runs are not sent unless
  // asked for): a choice reloads the page with it, keeping the search.
  let counts = d.kind_counts || {};  // runs per choice of the kind filter
  const KIND_WORDS = { user: "your runs", tuner: "tuner trials and controls", all: "every run",
    trial: "tuner trials", control: "tuner controls" };
  const labelKinds = () => {
    for (const opt of kind.options) opt.textContent = `${KIND_WORDS[opt.value]} (${counts[opt.value] ?? 0})`;
  };
  if (![...kind.options].some((o) => o.value === d.kind)) kind.append(T.el("option", { value: d.kind }));
  kind.value = d.kind;
  kind.addEventListener("change", () => {
    const q = search.value.trim();
    location.href = `/runs?kind=${encodeURIComponent(kind.value)}` + (q ? `&q=${encodeURIComponent(q)}` : "");
  });

  const matches = (r) => {
    const want = status.value;
    if (want === "live" ? !r.live : want && r.status !== want) return false;
    const q = search.value.trim().toLowerCase();
    return !q || [r.run_id, r.name, r.host, r.strategy, r.device, r.status]
      .some((v) => v && String(v).toLowerCase().includes(q));
  };
  const row = (r) => {
    const box = T.el("input", { type: "checkbox", "aria-label": `select ${r.run_id}` });
    box.checked = chosen.has(r.run_id);
    box.addEventListener("change", () => {
      if (box.checked) chosen.add(r.run_id); else chosen.delete(r.run_id);
      button.disabled = chosen.size < 2;
    });
    const state = r.live ? T.el("span", { class: "badge live", text: "live" })
      : r.status === T.catalogue.runs.RUNNING ? T.el("span", { class: "badge silent", text: `silent ${T.secs(r.silent_s)}` }) : null;
    const end = r.finished || (r.status === T.catalogue.runs.RUNNING ? Date.now() / 1000 : r.last_time);
    const link = r.tune ? `/tuner?session=${encodeURIComponent(r.run_id)}` : `/run/${encodeURIComponent(r.run_id)}`;
    return T.el("tr", { "data-run": r.run_id, class: r.live ? "live" : "" },
      T.el("td", {}, box),
      T.el("td", {}, T.el("a", { href: link, text: r.name }), T.el("div", { class: "muted", text: r.run_id + (r.kind && r.kind !== "user" ? ` · tuner ${r.kind}` : "") })),
      T.el("td", {}, T.el("span", { class: `badge ${r.status}`, text: r.status }), state),
      T.el("td", { text: T.when(r.started) }),
      T.el("td", { text: T.secs(end - r.started) }),
      // a resized run: every size it ran at, in order
      T.el("td", r.sizes && r.sizes.length > 1 ? { text: r.sizes.join(" → "), title: "resized: the process counts of its segments" } : { text: T.fmt(r.world_size) }),
      T.el("td", { text: r.device ?? "–" }),
      T.el("td", { text: r.tune ? "tune session" : (r.strategy ?? "–") }),
      T.el("td", { class: "num", text: T.fmt(r.steps) }),
      T.el("td", { class: "num", text: T.fmt(r.loss) }));
  };
  const render = () => {
    const all = [...runs.values()].sort((a, b) => b.started - a.started || (b.run_id > a.run_id ? 1 : -1));
    const shown = all.filter(matches);
    document.querySelector("#runs tbody").replaceChildren(...shown.map(row));
    const other = (counts.all ?? 0) - (counts[d.kind] ?? 0);
    labelKinds();
    document.getElementById("count").textContent =
      `${shown.length} of ${all.length} runs shown (${KIND_WORDS[d.kind]}) · ${all.filter((r) => r.live).length} live`
      + (other ? ` · ${other} more in the store, of other kinds` : "");
  };
  search.addEventListener("input", render);
  status.addEventListener("change", render);
  button.addEventListener("click", () => {
    location.href = `/compare?runs=${[...chosen].map(encodeURIComponent).join(",")}`;
  });
  render();
  T.ready();
  T.stream(`/runs?kind=${encodeURIComponent(d.kind)}`, d.cursor, (msg) => {
    for (const r of msg.runs || []) runs.set(r.run_id, r);
    if (msg.kind_counts) counts = msg.kind_counts;
    render();
  });
})();
