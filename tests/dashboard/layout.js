// What is wrong with the dashboard's layout at the window's size, from the
// bounding rectangles of its boxes (every element marked data-box: the
// header, tiles, charts, group headings, actor panels, section headings,
// tables, empty-state notes):
// - overlaps: two boxes that share more than a pixel each way;
// - holes: a box whose nearest box below it (sharing some of its width) is
//   more than MAX_GAP pixels lower: a blank band;
// - clipped: an element inside a box (outside a table's scroll area) whose
//   content is wider than itself, so its text is cut or spills;
// and the page's width against the viewport's (sideways scrolling).
const MAX_GAP = 32;
const name = (e) => e.dataset.box + " " + (e.dataset.actor || e.dataset.chart || e.id ||
  e.textContent.trim().replace(/\s+/g, " ").slice(0, 40));
const boxes = Array.from(document.querySelectorAll("[data-box]")).map((e) => {
  const r = e.getBoundingClientRect();
  return { e, name: name(e), left: r.left + scrollX, right: r.right + scrollX, top: r.top + scrollY, bottom: r.bottom + scrollY };
}).filter((b) => b.right - b.left > 0 && b.bottom - b.top > 0);
const shared = (a0, a1, b0, b1) => Math.min(a1, b1) - Math.max(a0, b0);
const overlaps = [];
for (let i = 0; i < boxes.length; i++) {
  for (let j = i + 1; j < boxes.length; j++) {
    const [a, b] = [boxes[i], boxes[j]];
    if (shared(a.left, a.right, b.left, b.right) > 1 && shared(a.top, a.bottom, b.top, b.bottom) > 1) {
      overlaps.push(a.name + " ⟷ " + b.name);
    }
  }
}
const holes = [];
for (const a of boxes) {
  const below = boxes.filter((b) => b !== a && b.top >= a.bottom - 1 && shared(a.left, a.right, b.left, b.right) > 1);
  if (!below.length) continue;
  const next = below.reduce((m, b) => (b.top < m.top ? b : m));
  if (next.top - a.bottom > MAX_GAP) holes.push(a.name + " → " + next.name + ": " + Math.round(next.top - a.bottom) + " px");
}
const clipped = [];
for (const b of boxes) {
  for (const e of [b.e, ...b.e.querySelectorAll("*")]) {
    if (!(e instanceof HTMLElement) || e.closest(".scroll") || e.clientWidth === 0) continue;
    if (e.scrollWidth > e.clientWidth + 1) {
      clipped.push(b.name + ": " + e.tagName.toLowerCase() + (e.className ? "." + e.className : "") +
        " " + e.scrollWidth + " > " + e.clientWidth + " px: " + e.textContent.trim().slice(0, 40));
    }
  }
}
return JSON.stringify({
  viewport: [window.innerWidth, window.innerHeight],
  page_width: document.documentElement.scrollWidth,
  boxes: boxes.length,
  overlaps,
  holes,
  clipped,
});
