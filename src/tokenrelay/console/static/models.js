// The models page reads the admin API with the tab's admin key: GET /admin/models (each engine model's residency),
// polled every few seconds since requests load and unload models too, and POST /admin/models/{id}/load|unload.
import { errorText, KeyPrompt } from "./keyprompt.js";
import { cell, notify, showRows } from "./listing.js";

const $ = (id) => document.getElementById(id);
const REFUSED = [401, 403]; // 403: a valid key, but not an admin key
const keys = new KeyPrompt("tokenrelay.adminKey", {
  askOn: REFUSED,
  refusedNote: "That key was refused: an admin key is needed.",
  onForget: () => forgotten(),
});

const POLL_MS = 3000;
const MIB = 2 ** 20;
const mib = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });
const count = new Intl.NumberFormat("en");

let timer = null; // the next poll
let latest = 0; // the newest load: an older one finishing later (a Refresh meanwhile) is dropped
let actionProblem = null; // a failed load or unload: kept through polls until the next click
const pending = new Set(); // models with a load or unload under way: their buttons stay disabled through polls

// ---- Loading ----------------------------------------------------------------------------------

async function load() {
  const mine = ++latest;
  clearTimeout(timer);
  try {
    const response = await keys.fetch("/admin/models");
    if (mine !== latest) return;
    if (!response.ok) {
      show(null, await errorText(response));
      // A refusal the user did not answer with a key: polling on would ask again every few seconds.
      if (REFUSED.includes(response.status)) return;
    } else {
      show((await response.json()).data);
    }
  } catch (error) {
    if (mine !== latest) return;
    show(null, error.message); // the server is unreachable: polling on shows it back when it returns
  }
  // Only the newest load schedules, so polls never pile up.
  if (mine === latest) timer = setTimeout(load, POLL_MS);
}

function forgotten() {
  latest++; // a load under way must not draw with the forgotten key
  clearTimeout(timer);
  show(null);
}

// models: the list to draw, or null when there is none to show (a refusal, a forgotten key).
function show(models, problem = null) {
  notify(problem || actionProblem);
  showRows("models", models, row);
}

// ---- Rows ---------------------------------------------------------------------------------------

function row(model) {
  const tr = document.createElement("tr");
  tr.dataset.model = model.id;
  tr.dataset.state = model.state;
  tr.append(
    cell(model.id, "id mono"),
    cell(model.state, "state"),
    cell(model.pinned ? "yes" : "no", "pinned"),
    cell(memory(model), "memory num"),
    cell(model.context_length == null ? "–" : count.format(model.context_length), "context num"),
    cell(count.format(model.in_flight), "in-flight num"),
    cell(`${model.loads} / ${model.unloads}`, "loads num"),
    actionCell(model),
  );
  return tr;
}

// Nothing in memory: what loading it would take, so the operator can judge whether it fits.
function memory(model) {
  if (model.memory_bytes > 0) return mib.format(model.memory_bytes / MIB);
  return `0 (est. ${mib.format(model.memory_estimate_bytes / MIB)})`;
}

function actionCell(model) {
  const td = cell("", "actions");
  const busy = pending.has(model.id);
  td.append(
    button("Load", "load", busy || model.state !== "unloaded", (clicked) => act(model.id, "load", clicked)),
    " ",
    button("Unload", "unload", busy || model.state !== "loaded", (clicked) => act(model.id, "unload", clicked)),
  );
  return td;
}

function button(label, className, disabled, onClick) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = className;
  element.textContent = label;
  element.disabled = disabled;
  element.addEventListener("click", () => onClick(element));
  return element;
}

// ---- Actions ------------------------------------------------------------------------------------

// action: "load" or "unload". A load answers once the model is loaded (seconds): the polls meanwhile show it
// `loading`, and another model `unloading` when room is made for it.
async function act(modelId, action, clicked) {
  clicked.disabled = true; // the row's redraws keep it so while the model is pending
  pending.add(modelId);
  actionProblem = null;
  try {
    const path = `/admin/models/${encodeURIComponent(modelId)}/${action}`;
    const response = await keys.fetch(path, { method: "POST" });
    if (!response.ok) actionProblem = `Could not ${action} ${modelId}: ${await errorText(response)}`;
  } catch (error) {
    actionProblem = `Could not ${action} ${modelId}: ${error.message}`;
  } finally {
    pending.delete(modelId);
  }
  await load();
}

$("refresh").addEventListener("click", () => {
  actionProblem = null;
  load();
});
load();
