// Small SVG charts over time buckets: stacked columns (amounts per series) and lines (rates, latencies).
// Written for these pages because they ship without a build step or CDN. Every drawn value is also in
// the markup (data-series, data-bucket, data-value and a <title> tooltip), so it can be read back.

const WIDTH = 640;
const HEIGHT = 220;
const PAD = { left: 56, right: 12, top: 12, bottom: 28 };
const GRID_LINES = 4;

function add(parent, name, attributes = {}, text = undefined) {
  // The <svg> was parsed from the page, so it carries the SVG namespace its children need.
  const node = document.createElementNS(parent.namespaceURI, name);
  for (const [attribute, value] of Object.entries(attributes)) node.setAttribute(attribute, String(value));
  if (text !== undefined) node.textContent = text;
  parent.append(node);
  return node;
}

// The smallest 1, 2, 2.5 or 5 × 10^k at or above `value`: round figures for the axis.
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 2.5, 5, 10].find((step) => step * power >= value * (1 - 1e-9)) * power;
}

// Axes, grid and bucket labels; returns the geometry the series are drawn with.
function frame(svg, { labels, max, format }) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  const plot = { left: PAD.left, top: PAD.top, width: WIDTH - PAD.left - PAD.right, height: HEIGHT - PAD.top - PAD.bottom };
  const slot = plot.width / labels.length;
  const geometry = {
    slot,
    x: (i) => plot.left + slot * (i + 0.5),
    y: (value) => plot.top + plot.height * (1 - value / max),
  };
  const axis = add(svg, "g", { class: "axis" });
  for (let line = 0; line <= GRID_LINES; line++) {
    const value = (max * line) / GRID_LINES;
    const y = geometry.y(value);
    add(axis, "line", { x1: plot.left, x2: plot.left + plot.width, y1: y, y2: y, class: line ? "grid" : "base" });
    add(axis, "text", { x: plot.left - 6, y: y + 4, "text-anchor": "end" }, format(value));
  }
  labels.forEach((label, i) => {
    if (label.short) add(axis, "text", { x: geometry.x(i), y: HEIGHT - 8, "text-anchor": "middle" }, label.short);
  });
  return geometry;
}

function nothing(svg, message) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${WIDTH} ${HEIGHT}`);
  add(svg, "text", { x: WIDTH / 2, y: HEIGHT / 2, "text-anchor": "middle", class: "empty" }, message);
  svg.dataset.empty = "true";
}

function tooltip(node, series, label, text) {
  add(node, "title", {}, `${series.name} · ${label.full}: ${text}`);
}

// labels: [{short (the axis label, empty for none), full (for tooltips)}] per bucket;
// series: [{name, color, values: [number per bucket]}].
export function stackedColumns(svg, { labels, series, format, empty = "No requests in this period" }) {
  const totals = labels.map((_, i) => series.reduce((sum, s) => sum + (s.values[i] || 0), 0));
  if (!totals.some((total) => total > 0)) return nothing(svg, empty);
  delete svg.dataset.empty;
  const chart = frame(svg, { labels, max: niceMax(Math.max(...totals)), format });
  const width = Math.max(1, chart.slot * 0.7);
  const columns = add(svg, "g", { class: "columns" });
  labels.forEach((label, i) => {
    let below = 0;
    for (const s of series) {
      const value = s.values[i] || 0;
      if (!value) continue;
      const top = chart.y(below + value);
      const attributes = { x: chart.x(i) - width / 2, y: top, width, height: Math.max(chart.y(below) - top, 1) };
      const data = { "data-series": s.name, "data-bucket": i, "data-value": value };
      tooltip(add(columns, "rect", { class: "bar", fill: s.color, ...attributes, ...data }), s, label, format(value));
      below += value;
    }
  });
}

// Like stackedColumns, but each series is a line (dashed when it has a `dash` pattern); null values (no data
// in a bucket) break the line. Earlier series are drawn over later ones.
export function lines(svg, { labels, series, format, empty = "No requests in this period" }) {
  const values = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  if (!values.length) return nothing(svg, empty);
  delete svg.dataset.empty;
  const chart = frame(svg, { labels, max: niceMax(Math.max(...values)), format });
  for (const s of [...series].reverse()) {
    const group = add(svg, "g", { class: "line", "data-series": s.name });
    let path = "";
    s.values.forEach((value, i) => {
      if (value === null || value === undefined) return;
      const joined = i > 0 && s.values[i - 1] !== null && s.values[i - 1] !== undefined;
      path += `${joined ? "L" : "M"}${chart.x(i).toFixed(1)} ${chart.y(value).toFixed(1)} `;
    });
    add(group, "path", { d: path.trim(), stroke: s.color, fill: "none", ...(s.dash ? { "stroke-dasharray": s.dash } : {}) });
    s.values.forEach((value, i) => {
      if (value === null || value === undefined) return;
      const point = { cx: chart.x(i), cy: chart.y(value), r: 3, fill: s.color };
      const data = { "data-series": s.name, "data-bucket": i, "data-value": value };
      tooltip(add(group, "circle", { ...point, ...data }), s, labels[i], format(value));
    });
  }
}
