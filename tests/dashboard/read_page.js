// What the dashboard shows, as the test reads it: one entry per actor
// panel (the text of each field), the syncs table's rows (cell texts), the
// ignored-values tile, the status line, the empty-state notes shown, the
// page height, and every resource the page loaded.
const text = (root, sel) => {
  const e = root.querySelector(sel);
  return e ? e.textContent : null;
};
const panels = Array.from(document.querySelectorAll("[data-actor]")).map((p) => ({
  name: p.dataset.actor,
  depth: text(p, '[data-field="mailbox_depth"]'),
  rate: text(p, '[data-field="msgs_per_sec"]'),
  received: text(p, '[data-field="received"]'),
  p50: text(p, '[data-field="p50_ms"]'),
  p99: text(p, '[data-field="p99_ms"]'),
  errors: text(p, '[data-field="errors"]'),
}));
const syncs = Array.from(document.querySelectorAll("#syncs tr")).map((r) =>
  Array.from(r.cells).map((c) => c.textContent.trim()));
const schedulers = Array.from(document.querySelectorAll("#schedulers tr")).map((r) =>
  Array.from(r.cells).map((c) => c.textContent.trim()));
return JSON.stringify({
  panels,
  syncs,
  schedulers,
  ignored: [text(document, "#sum-ignored"), text(document, "#sum-ignored-last")],
  status: document.getElementById("status").className,
  status_text: document.getElementById("status-text").textContent,
  // The empty-state notes that are showing.
  empty: Array.from(document.querySelectorAll(".empty:not(.hidden)")).map((e) => e.textContent),
  height: document.documentElement.scrollHeight,
  resources: performance.getEntriesByType("resource").map((e) => e.name),
});
