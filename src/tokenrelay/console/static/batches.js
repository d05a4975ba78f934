// The batches page reads the public Batch API with the tab's key: GET /v1/batches (the key's own batches; an
// admin key sees all), and polls it while any listed batch is still running, so progress bars move live.
import { errorText, KeyPrompt } from "./keyprompt.js";
import { cell, notify, showRows } from "./listing.js";

const $ = (id) => document.getElementById(id);
const keys = new KeyPrompt("tokenrelay.apiKey", { onForget: () => forgotten() });

const ENDED = new Set(["completed", "failed", "expired", "cancelled"]);
const CANCELLABLE = new Set(["validating", "in_progress"]);
const POLL_MS = 2000;
const PAGE = 100; // the API's largest page

let timer = null; // the next poll, while a listed batch can still change
let latest = 0; // the newest load: an older one finishing later (a Refresh meanwhile) is dropped
let actionProblem = null; // a failed cancel or download: kept through polls until the next click

// ---- Loading ----------------------------------------------------------------------------------

async function listAll() {
  const batches = [];
  let after = null;
  for (;;) {
    const query = new URLSearchParams({ limit: String(PAGE), ...(after ? { after } : {}) });
    const response = await keys.fetch(`/v1/batches?${query}`);
    if (!response.ok) throw new Error(await errorText(response));
    const page = await response.json();
    batches.push(...page.data);
    if (!page.has_more || !page.data.length) return batches;
    after = page.last_id;
  }
}

async function load() {
  const mine = ++latest;
  clearTimeout(timer);
  try {
    const batches = await listAll();
    if (mine !== latest) return;
    show(batches);
    // Poll again only while something can still change; only the newest load schedules, so polls never pile up.
    if (batches.some((batch) => !ENDED.has(batch.status))) timer = setTimeout(load, POLL_MS);
  } catch (error) {
    if (mine === latest) show(null, error.message);
  }
}

function forgotten() {
  latest++; // a load under way must not draw the forgotten key's batches
  clearTimeout(timer);
  show(null);
}

// batches: the list to draw, or null when there is none to show (a refusal, a forgotten key).
function show(batches, problem = null) {
  notify(problem || actionProblem);
  showRows("batches", batches, row);
}

// ---- Rows ---------------------------------------------------------------------------------------

function row(batch) {
  const counts = batch.request_counts || { total: 0, completed: 0, failed: 0 };
  const tr = document.createElement("tr");
  tr.dataset.batch = batch.id;
  tr.dataset.status = batch.status;
  tr.append(
    cell(batch.id, "id mono"),
    cell(batch.endpoint, "endpoint"),
    cell(new Date(batch.created_at * 1000).toISOString().slice(0, 19).replace("T", " "), "created"),
    cell(batch.status, "status"),
    progressCell(counts),
    cell(String(counts.completed), "completed num"),
    cell(String(counts.failed), "failed num"),
    filesCell(batch),
    actionCell(batch),
  );
  return tr;
}

// A <progress> is a progressbar to assistive technology, its value and max read as aria-valuenow/-valuemax.
function progressCell(counts) {
  const bar = document.createElement("progress");
  const done = counts.completed + counts.failed;
  bar.max = Math.max(counts.total, 1); // a validating batch has no lines counted yet
  bar.value = done;
  bar.setAttribute("aria-label", `${done} of ${counts.total} lines done`);
  const td = cell("", "progress");
  td.append(bar, ` ${done} / ${counts.total}`);
  return td;
}

function filesCell(batch) {
  const td = cell("", "files");
  for (const [label, fileId] of [["output", batch.output_file_id], ["errors", batch.error_file_id]]) {
    if (!fileId) continue;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "link";
    button.textContent = label;
    button.dataset.file = fileId;
    button.addEventListener("click", () => download(fileId, `${batch.id}_${label}.jsonl`));
    td.append(button, " ");
  }
  return td;
}

function actionCell(batch) {
  const td = cell("", "actions");
  if (CANCELLABLE.has(batch.status)) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "cancel";
    button.textContent = "Cancel";
    button.addEventListener("click", () => cancel(batch.id, button));
    td.append(button);
  }
  return td;
}

// ---- Actions ------------------------------------------------------------------------------------

// A plain link cannot carry the bearer key: the file is fetched with it and saved from a Blob URL.
async function download(fileId, name) {
  actionProblem = null;
  const response = await keys.fetch(`/v1/files/${encodeURIComponent(fileId)}/content`);
  if (!response.ok) {
    actionProblem = `Could not download ${name}: ${await errorText(response)}`;
    return notify(actionProblem);
  }
  notify(null);
  const url = URL.createObjectURL(await response.blob());
  Object.assign(document.createElement("a"), { href: url, download: name }).click();
  setTimeout(() => URL.revokeObjectURL(url), 0); // after the click's download has taken the blob
}

async function cancel(batchId, button) {
  button.disabled = true; // the row is redrawn by the load below
  actionProblem = null;
  const response = await keys.fetch(`/v1/batches/${encodeURIComponent(batchId)}/cancel`, { method: "POST" });
  if (!response.ok) actionProblem = `Could not cancel ${batchId}: ${await errorText(response)}`;
  await load(); // shows `cancelling`, and polls on until the running lines are done
}

$("refresh").addEventListener("click", () => {
  actionProblem = null;
  load();
});
load();
