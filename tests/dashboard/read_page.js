// What the dashboard shows, as the test reads it: the header's facts, the
// actor group headings, one entry per actor panel (the text of each
// field), the syncs table's rows (cell texts), the points drawn in each
// chart's lines, the ignored-values tile, the status line, the empty-state
// notes shown, the page height, and every resource the page loaded.
const text = (root, sel) => {
  const e = root.querySelector(sel);
  return e ? e.textContent : null;
};
const rows = (sel) => Array.from(document.querySelectorAll(sel)).map((r) =>
  Array.from(r.cells).map((c) => c.textContent.trim()));
const facts = {};
for (const f of document.querySelectorAll("[data-fact]")) facts[f.dataset.fact] = f.querySelector("dd").textContent.trim();
const panels = Array.from(document.querySelectorAll("[data-actor]")).map((p) => ({
  name: p.dataset.actor,
  depth: text(p, '[data-field="mailbox_depth"]'),
  rate: text(p, '[data-field="msgs_per_sec"]'),
  received: text(p, '[data-field="received"]'),
  p50: text(p, '[data-field="p50_ms"]'),
  p99: text(p, '[data-field="p99_ms"]'),
  errors: text(p, '[data-field="errors"]'),
}));
const charts = {};
for (const c of document.querySelectorAll("[data-chart]")) {
  charts[c.dataset.chart] = {};
  for (const line of c.querySelectorAll("polyline[data-series]")) {
    charts[c.dataset.chart][line.dataset.series] = line.points.numberOfItems;
  }
}
return JSON.stringify({
  facts,
  groups: Array.from(document.querySelectorAll("#actors h3")).map((h) => h.textContent.trim()),
  panels,
  syncs: rows("#syncs tr"),
  schedulers: rows("#schedulers tr"),
  charts,
  ignored: [text(document, "#sum-ignored"), text(document, "#sum-ignored-last")],
  status: document.getElementById("status").className,
  status_text: document.getElementById("status-text").textContent,
  // The empty-state notes that are showing.
  empty: Array.from(document.querySelectorAll(".empty:not(.hidden)")).map((e) => e.textContent),
  height: document.documentElement.scrollHeight,
  resources: performance.getEntriesByType("resource").map((e) => e.name),
});
