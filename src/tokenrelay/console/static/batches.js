// The batches page reads the public Batch API with the tab's key: GET /v1/batches (the key's own batches; an
// admin key sees all), and polls it while any listed batch is still running, so progress bars move live.
import { errorText, KeyPrompt } from "./keyprompt.js";

const $ = (id) => document.getElementById(id);
const keys = new KeyPrompt("tokenrelay.apiKey", { onForget: () => load() });

const ENDED = new Set(["completed", "failed", "expired", "cancelled"]);
const CANCELLABLE = new Set(["validating", "in_progress"]);
const POLL_MS = 2000;
const PAGE = 100; // the API's largest page

let timer = null;

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
  clearTimeout(timer);
  try {
    const batches = await listAll();
    show(batches);
    // Poll again only while something can still change.
    if (batches.some((batch) => !ENDED.has(batch.status))) timer = setTimeout(load, POLL_MS);
  } catch (error) {
    show([], error.message);
  }
}

function show(batches, problem = null) {
  $("notice").hidden = !problem;
  $("notice").textContent = problem || "";
  $("empty").hidden = Boolean(problem) || batches.length > 0;
  $("dashboard").dataset.state = problem ? "empty" : "ready";
  $("batches").tBodies[0].replaceChildren(...batches.map(row));
}

function row(batch) {
  const counts = batch.request_counts || { total: 0, completed: 0, failed: 0 };
  const tr = document.createElement("tr");
  tr.dataset.batch = batch.id;
  tr.dataset.status = batch.status;
  tr.append(
    cell(batch.id, "id"),
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

function cell(text, className) {
  const td = document.createElement("td");
  td.className = className;
  td.textContent = text;
  return td;
}

function progressCell(counts) {
  const bar = document.createElement("progress");
  const done = counts.completed + counts.failed;
  bar.max = Math.max(counts.total, 1);
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

// A plain link cannot carry the bearer key: the file is fetched with it and saved from a Blob URL.
async function download(fileId, name) {
  const response = await keys.fetch(`/v1/files/${encodeURIComponent(fileId)}/content`);
  if (!response.ok) return show([], await errorText(response));
  const url = URL.createObjectURL(await response.blob());
  const link = Object.assign(document.createElement("a"), { href: url, download: name });
  link.click();
  URL.revokeObjectURL(url);
}

async function cancel(batchId, button) {
  button.disabled = true;
  const response = await keys.fetch(`/v1/batches/${encodeURIComponent(batchId)}/cancel`, { method: "POST" });
  if (!response.ok) $("notice").textContent = await errorText(response);
  $("notice").hidden = response.ok;
  await load();
}

$("refresh").addEventListener("click", () => load());
load();
