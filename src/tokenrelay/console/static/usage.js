// The usage page reads the admin API: /admin/usage/series (buckets over time), /admin/keys (limits and
// budgets) and /admin/usage?by=key|model|day (totals and costs for the period), all with the tab's admin key.
import { lines, stackedColumns } from "./charts.js";
import { errorText, KeyPrompt } from "./keyprompt.js";

const $ = (id) => document.getElementById(id);
const keys = new KeyPrompt("tokenrelay.adminKey", {
  askOn: [401, 403], // 403: a valid key, but not an admin key
  refusedNote: "That key was refused: an admin key is needed.",
  onForget: () => show(null),
});

const RANGES = {
  "24h": { bucket: "hour", buckets: 24 },
  "7d": { bucket: "hour", buckets: 7 * 24 },
  "30d": { bucket: "day", buckets: 30 },
  "90d": { bucket: "day", buckets: 90 },
};
const STEP_MS = { hour: 3_600_000, day: 86_400_000 };
const PALETTE = ["#2f6fde", "#e8833a", "#2a9d8f", "#c4456b", "#8a5cd1", "#b8a000", "#4f9d3a", "#8c6239"];
const OTHER_COLOR = "#9aa2b3";
const PERCENTILES = {
  p50: { color: "#2a9d8f" },
  p95: { color: "#e8833a", dash: "6 4" }, // dashed: often equal to p99 over a few requests, and drawn over it
  p99: { color: "#c4456b" },
};

const count = new Intl.NumberFormat("en");
const compact = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });
const charted = new Intl.NumberFormat("en", { maximumSignificantDigits: 4 });
const formats = {
  count: (v) => compact.format(v),
  money: (v) => charted.format(v), // a chart's amounts, in units of the currency its caption names
  percent: (v) => `${Number(v.toFixed(1))}%`,
  ms: (v) => (v >= 1000 ? `${Number((v / 1000).toFixed(2))} s` : `${Math.round(v)} ms`),
};

// An exact amount as the API gives it ("1.230000"), its trailing zeros dropped down to cents ("1.23"): the
// figure is shown as charged, never rounded through a float.
function amount(cost) {
  return cost.replace(/(\.\d\d\d*?)0+$/, "$1");
}

// ---- Loading ----------------------------------------------------------------------------------

async function getJson(path) {
  const response = await keys.fetch(path);
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

function seriesPath() {
  const range = RANGES[$("range").value];
  const since = new Date(Date.now() - (range.buckets - 1) * STEP_MS[range.bucket]).toISOString();
  const query = new URLSearchParams({ bucket: range.bucket, by: $("by").value, since });
  return `/admin/usage/series?${query}`;
}

let latest = 0; // the newest load: an older one finishing later (the period changed meanwhile) is dropped

async function load() {
  const mine = ++latest;
  $("dashboard").dataset.state = "loading";
  try {
    const series = await getJson(seriesPath()); // asks for the key first, so the next ones need not
    const totals = (by) => getJson(`/admin/usage?${new URLSearchParams({ by, since: series.since })}`);
    const [keyList, perKey, perModel, perDay] = await Promise.all([
      getJson("/admin/keys"),
      totals("key"),
      totals("model"),
      totals("day"),
    ]);
    const data = { series, keys: keyList.data, perKey: perKey.groups, perModel: perModel.groups, perDay: perDay.groups };
    if (mine === latest) show(data);
  } catch (error) {
    if (mine === latest) show(null, error.message);
  }
}

function show(data, problem = null) {
  $("notice").hidden = !problem;
  $("notice").textContent = problem || "";
  $("dashboard").dataset.state = data ? "ready" : "empty";
  if (!data) {
    for (const svg of document.querySelectorAll(".chart svg")) svg.replaceChildren();
    for (const legend of document.querySelectorAll(".series-legend")) legend.replaceChildren();
    $("tiles").replaceChildren();
    for (const table of document.querySelectorAll(".listing table")) table.tBodies[0].replaceChildren();
    return;
  }
  const currency = data.series.currency;
  for (const label of document.querySelectorAll(".currency")) label.textContent = `(${currency})`;
  tiles(data.series.total.summary, currency);
  charts(data.series);
  keyTable(data.keys, data.perKey);
  totalsTable("models", data.perModel, (group) => group.model);
  totalsTable("days", data.perDay, (group) => group.day);
}

// ---- Totals and charts ------------------------------------------------------------------------

function unpricedNote(unpriced) {
  return unpriced ? `${count.format(unpriced)} unpriced (cost 0)` : "every request priced";
}

function tiles(summary, currency) {
  const errorRate = summary.requests ? (100 * summary.failed) / summary.requests : 0;
  const ms = (value) => (value === null ? "–" : formats.ms(value));
  const entries = [
    ["Requests", count.format(summary.requests)],
    ["Tokens", count.format(summary.total_tokens), `${count.format(summary.prompt_tokens)} prompt · ${count.format(summary.completion_tokens)} completion`],
    ["Cost", `${amount(summary.cost)} ${currency}`, unpricedNote(summary.unpriced_requests)],
    ["Error rate", formats.percent(errorRate), `${count.format(summary.failed)} failed`],
    ["Latency p50 / p95 / p99", ["p50", "p95", "p99"].map((p) => ms(summary.latency_ms[p])).join(" / ")],
    ["First token p50", ms(summary.ttft_ms.p50)],
  ];
  $("tiles").replaceChildren(
    ...entries.map(([name, value, detail]) => {
      const tile = document.createElement("div");
      tile.className = "tile";
      tile.dataset.tile = name;
      tile.innerHTML = `<span class="name"></span><span class="value"></span><span class="detail"></span>`;
      tile.querySelector(".name").textContent = name;
      tile.querySelector(".value").textContent = value;
      tile.querySelector(".detail").textContent = detail || "";
      return tile;
    }),
  );
}

// Axis labels on round boundaries: every 1-12 hours over up to four days, else on some midnights.
const LABELS_WANTED = 8;
const HOUR_STEPS = [1, 2, 3, 6, 12];
const DAY_STEPS = [1, 2, 5, 7, 14, 28, 56];

function bucketLabels(series) {
  const count = series.buckets.length;
  const hourly = series.bucket === "hour";
  const perDay = hourly ? 24 : 1;
  const fits = (step) => count / step <= LABELS_WANTED;
  const hourStep = hourly ? HOUR_STEPS.find(fits) : undefined;
  const dayStep = DAY_STEPS.find((days) => fits(days * perDay)) ?? DAY_STEPS.at(-1);
  return series.buckets.map((iso) => {
    const date = iso.slice(0, 10);
    const hour = Number(iso.slice(11, 13));
    const day = Math.floor(Date.parse(date) / STEP_MS.day);
    const full = hourly ? `${date} ${iso.slice(11, 16)} UTC` : `${date} UTC`;
    let short = "";
    if (hourStep !== undefined) short = hour % hourStep ? "" : hour ? iso.slice(11, 16) : date.slice(5);
    else if (hour === 0 && day % dayStep === 0) short = date.slice(5);
    return { short, full };
  });
}

function seriesName(entry, by) {
  if (entry.other !== undefined) return `other (${entry.other})`;
  if (by === "model") return entry.model;
  return entry.key_name ?? "(no key)";
}

function legend(chartId, series) {
  const box = document.querySelector(`.series-legend[data-for=${chartId}]`);
  box.replaceChildren(
    ...series.map((s) => {
      const item = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = s.color;
      item.append(swatch, s.name);
      return item;
    }),
  );
}

function charts(data) {
  const labels = bucketLabels(data);
  const groups = data.series.map((entry, i) => ({
    entry,
    name: seriesName(entry, data.by),
    color: entry.other !== undefined ? OTHER_COLOR : PALETTE[i % PALETTE.length],
  }));
  const pick = (values) => groups.map(({ entry, name, color }) => ({ name, color, values: values(entry) }));

  const tokens = pick((e) => e.prompt_tokens.map((p, i) => p + e.completion_tokens[i]));
  stackedColumns($("chart-tokens"), { labels, series: tokens, format: formats.count });
  const cost = pick((e) => e.cost_micros.map((micros) => micros / 1e6));
  stackedColumns($("chart-cost"), { labels, series: cost, format: formats.money, empty: "No cost in this period" });
  const requests = pick((e) => e.requests);
  stackedColumns($("chart-requests"), { labels, series: requests, format: formats.count });
  const errors = pick((e) => e.requests.map((n, i) => (n ? (100 * e.failed[i]) / n : null)));
  lines($("chart-errors"), { labels, series: errors, format: formats.percent });
  for (const id of ["chart-tokens", "chart-cost", "chart-requests", "chart-errors"]) legend(id, tokens);

  const latency = Object.entries(PERCENTILES).map(([p, look]) => ({ name: p, ...look, values: data.total.latency_ms[p] }));
  lines($("chart-latency"), { labels, series: latency, format: formats.ms, empty: "No answered requests in this period" });
  legend("chart-latency", latency);
}

// ---- Keys ---------------------------------------------------------------------------------------

function keyState(key, now) {
  if (key.revoked_at) return "revoked";
  if (key.expires_at && Date.parse(key.expires_at) <= now) return "expired";
  return key.admin ? "active · admin" : "active";
}

function limits(key) {
  const parts = [key.rpm && `${count.format(key.rpm)} rpm`, key.tpm && `${count.format(key.tpm)} tpm`].filter(Boolean);
  return parts.join(" · ") || "none";
}

function budgetLeft(key) {
  const cell = document.createElement("td");
  cell.className = "left";
  if (key.budget_tokens === null) {
    cell.textContent = "unlimited";
    return cell;
  }
  const left = Math.max(0, key.budget_tokens - key.budget_used);
  const share = key.budget_tokens ? left / key.budget_tokens : 0;
  cell.dataset.left = String(left);
  const bar = document.createElement("span");
  bar.className = "budget";
  const fill = document.createElement("span");
  fill.style.width = `${(100 * share).toFixed(1)}%`;
  fill.className = share < 0.1 ? "low" : "";
  bar.append(fill);
  cell.append(bar, ` ${count.format(left)} (${Math.round(100 * share)}%)`);
  return cell;
}

// A row saying a table is empty, across all its columns.
function noneRow(tableId, text) {
  const row = document.createElement("tr");
  const cell = document.createElement("td");
  cell.colSpan = $(tableId).tHead.rows[0].cells.length;
  cell.className = "none";
  cell.textContent = text;
  row.append(cell);
  return row;
}

// A cell from [text, class names].
function cellOf([text, className]) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function keyTable(keyList, perKey) {
  const now = Date.now();
  const usageById = new Map(perKey.map((group) => [group.key_id, group]));
  const rows = keyList.map((key) => {
    const used = usageById.get(key.id);
    const row = document.createElement("tr");
    row.dataset.key = key.name;
    const cells = [
      [key.name, "name"],
      [key.prefix, "mono"],
      [key.models ? key.models.join(", ") : "all"],
      [limits(key)],
      [key.budget_tokens === null ? "–" : count.format(key.budget_tokens), "num"],
      [count.format(key.budget_used), "num"],
      null, // budget left, with its bar
      [count.format(used?.requests ?? 0), "num requests"],
      [count.format(used?.total_tokens ?? 0), "num tokens"],
      [amount(used?.cost ?? "0.00"), "num cost"],
      [key.last_used_at ? key.last_used_at.replace("T", " ").replace("Z", " UTC") : "never"],
      [keyState(key, now), "state"],
    ];
    row.append(...cells.map((cell) => (cell === null ? budgetLeft(key) : cellOf(cell))));
    return row;
  });
  if (!rows.length) rows.push(noneRow("keys", "No API keys yet: create one with `tokenrelay keys create` or POST /admin/keys."));
  $("keys").tBodies[0].replaceChildren(...rows);
}

// ---- Totals by model and by day -------------------------------------------------------------------

// The columns of both tables after the model or day: heading, class names, the figure shown, and whether the
// heading names the currency.
const TOTALS = [
  { heading: "Requests", className: "num requests", figure: (g) => count.format(g.requests) },
  { heading: "Tokens", className: "num tokens", figure: (g) => count.format(g.total_tokens) },
  { heading: "Cost", className: "num cost", figure: (g) => amount(g.cost), currency: true },
  { heading: "Unpriced requests", className: "num unpriced", figure: (g) => count.format(g.unpriced_requests) },
];

function totalsHead(table) {
  const headings = [{ heading: table.dataset.label }, ...TOTALS].map(({ heading, className, currency }) => {
    const th = document.createElement("th");
    th.textContent = heading;
    if (className) th.className = className.split(" ")[0]; // alignment only
    if (currency) th.append(" ", Object.assign(document.createElement("span"), { className: "currency" }));
    return th;
  });
  table.tHead.replaceChildren(document.createElement("tr"));
  table.tHead.rows[0].append(...headings);
}

function totalsTable(tableId, groups, labelOf) {
  const rows = groups.map((group) => {
    const row = document.createElement("tr");
    row.dataset.group = labelOf(group);
    const cells = [[labelOf(group), "name"], ...TOTALS.map(({ className, figure }) => [figure(group), className])];
    row.append(...cells.map(cellOf));
    return row;
  });
  if (!rows.length) rows.push(noneRow(tableId, "No requests in this period."));
  $(tableId).tBodies[0].replaceChildren(...rows);
}

// ---- Wiring -------------------------------------------------------------------------------------

for (const id of ["models", "days"]) totalsHead($(id));
$("refresh").addEventListener("click", load);
$("range").addEventListener("change", load);
$("by").addEventListener("change", load);
load();
