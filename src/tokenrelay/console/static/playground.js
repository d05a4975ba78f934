// The playground talks to the public OpenAI-compatible API exactly as any client would:
// GET /v1/models, then POST /v1/chat/completions streamed as server-sent events.
import { errorText, KeyPrompt } from "./keyprompt.js";

const $ = (id) => document.getElementById(id);
const keys = new KeyPrompt("tokenrelay.apiKey"); // sessionStorage only: the key dies with the tab
const conversation = []; // [{role, content}] sent with every turn
let running = null; // AbortController of the reply being streamed

// ---- Server-sent events over fetch + ReadableStream -------------------------------------------

function eventData(block) {
  // Joins an event's `data:` lines; comments (keep-alives) and other fields are ignored.
  const lines = block.split("\n").filter((line) => line.startsWith("data:"));
  return lines.length ? lines.map((line) => line.slice(5).replace(/^ /, "")).join("\n") : null;
}

async function* sseChunks(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const data = eventData(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (data === "[DONE]") return;
        if (data !== null) yield JSON.parse(data);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// ---- The request ------------------------------------------------------------------------------

function numberOr(id, fallback) {
  const text = $(id).value.trim();
  return text === "" ? fallback : Number(text);
}

function requestBody() {
  const system = $("system").value.trim();
  const body = {
    model: $("model").value,
    messages: [...(system ? [{ role: "system", content: system }] : []), ...conversation],
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    max_tokens: numberOr("max-tokens", undefined),
  };
  const seed = numberOr("seed", null);
  if (seed !== null) body.seed = Math.trunc(seed);
  const stop = $("stop").value.split("\n").filter((s) => s.length > 0).slice(0, 4);
  if (stop.length) body.stop = stop;
  if ($("logprobs").checked) {
    body.logprobs = true;
    body.top_logprobs = numberOr("top-logprobs", 0);
  }
  return body;
}

// ---- The transcript ---------------------------------------------------------------------------

function addMessage(role, text) {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  el.append(label, content);
  $("transcript").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

function shade(probability) {
  // Red for unlikely tokens through yellow to green for near-certain ones.
  return `hsl(${Math.round(120 * probability)} 75% 80%)`;
}

function percent(logprob) {
  return `${(100 * Math.exp(logprob)).toFixed(1)}%`;
}

function tokenSpan(text, logprob, tooltip) {
  const span = document.createElement("span");
  span.className = "token";
  span.textContent = text;
  span.dataset.logprob = String(logprob);
  span.style.backgroundColor = shade(Math.exp(logprob));
  span.title = tooltip;
  return span;
}

function tokenTooltip(entry) {
  const alternatives = (entry.top_logprobs || [])
    .map((alt) => `${JSON.stringify(alt.token)} ${percent(alt.logprob)}`)
    .join("\n");
  return `${JSON.stringify(entry.token)} ${percent(entry.logprob)}${alternatives ? `\nalternatives:\n${alternatives}` : ""}`;
}

class Reply {
  constructor() {
    this.el = addMessage("assistant", "");
    this.el.dataset.state = "streaming";
    this.content = this.el.querySelector(".content");
    this.text = "";
    this.sentAt = performance.now();
    this.firstAt = null;
    this.finish = null;
  }

  add(text, logprobs) {
    if (!text) return;
    this.firstAt ??= performance.now();
    this.text += text;
    if (logprobs && logprobs.length) this.content.append(...this.spans(text, logprobs));
    else this.content.append(text);
    this.el.scrollIntoView({ block: "end" });
  }

  spans(text, entries) {
    // One span per token when the tokens spell the text; a token can hold part of a UTF-8 character,
    // and then the whole delta is shaded by its joint probability instead.
    if (entries.map((e) => e.token).join("") === text) {
      return entries.map((e) => tokenSpan(e.token, e.logprob, tokenTooltip(e)));
    }
    const joint = entries.reduce((sum, e) => sum + e.logprob, 0);
    return [tokenSpan(text, joint, entries.map(tokenTooltip).join("\n\n"))];
  }

  usage(usage) {
    const parts = [
      `prompt ${usage.prompt_tokens}`,
      `completion ${usage.completion_tokens}`,
      `total ${usage.total_tokens}`,
    ];
    const cached = usage.prompt_tokens_details?.cached_tokens;
    if (cached) parts.push(`cached ${cached}`);
    if (this.firstAt !== null) {
      parts.push(`first token ${Math.round(this.firstAt - this.sentAt)} ms`);
      const seconds = (performance.now() - this.firstAt) / 1000;
      if (usage.completion_tokens > 1 && seconds > 0) {
        parts.push(`${((usage.completion_tokens - 1) / seconds).toFixed(1)} tok/s`);
      }
    }
    if (this.finish) parts.push(`finish ${this.finish}`);
    const line = document.createElement("div");
    line.className = "usage";
    line.textContent = parts.join(" · ");
    this.el.append(line);
  }

  end(state, message) {
    this.el.dataset.state = state;
    if (message) {
      const note = document.createElement("div");
      note.className = "usage";
      note.textContent = message;
      this.el.append(note);
    }
    if (state === "error") this.el.classList.add("error");
  }
}

async function stream(reply, response) {
  for await (const chunk of sseChunks(response)) {
    if (chunk.error) throw new Error(chunk.error.message);
    for (const choice of chunk.choices || []) {
      reply.add(choice.delta?.content, choice.logprobs?.content);
      if (choice.finish_reason) reply.finish = choice.finish_reason;
    }
    if (chunk.usage) reply.usage(chunk.usage);
  }
}

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = new Reply();
  running = new AbortController();
  setBusy(true);
  try {
    const response = await keys.fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(requestBody()),
      signal: running.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    await stream(reply, response);
    reply.end("done");
  } catch (error) {
    if (error.name === "AbortError") reply.end("stopped", "stopped");
    else reply.end("error", error.message);
  } finally {
    if (reply.text) conversation.push({ role: "assistant", content: reply.text });
    else conversation.pop(); // nothing came back: let the user edit and resend the same turn
    running = null;
    setBusy(false);
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("clear").disabled = busy; // a half-finished turn would land in the cleared conversation
  $("stop-button").disabled = !busy;
}

// ---- Wiring -----------------------------------------------------------------------------------

async function loadModels() {
  const select = $("model");
  const response = await keys.fetch("/v1/models");
  if (!response.ok) {
    select.replaceChildren(new Option("unavailable", ""));
    addMessage("assistant", `Could not list models: ${await errorText(response)}`).classList.add("error");
    return;
  }
  const { data } = await response.json();
  select.replaceChildren(...data.map((model) => new Option(model.id, model.id)));
  const ids = data.map((model) => model.id);
  const chosen = sessionStorage.getItem(MODEL_CHOICE);
  select.value = ids.includes(chosen) ? chosen : (await firstChatModel(ids)) ?? ids[0] ?? "";
}

// The user's pick is kept for this tab; without one the page opens on a chat model, since a base model's
// answers to a conversation read as gibberish (`/health` says which models are for chat).
const MODEL_CHOICE = "tokenrelay.model";

async function firstChatModel(ids) {
  const response = await fetch("/health");
  const { models = {} } = await response.json().catch(() => ({}));
  return ids.find((id) => models[id]?.chat !== false);
}

function mirror(inputId) {
  const input = $(inputId);
  const output = $(`${inputId}-value`);
  input.addEventListener("input", () => (output.value = input.value));
}

function wire() {
  $("model").addEventListener("change", () => sessionStorage.setItem(MODEL_CHOICE, $("model").value));
  mirror("temperature");
  mirror("top-p");
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || running || !$("model").value) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop-button").addEventListener("click", () => running?.abort());
  $("clear").addEventListener("click", () => {
    conversation.length = 0;
    $("transcript").replaceChildren();
  });
}

wire();
loadModels();
