// The quickdraft playground: a chat over the server's own OpenAI-compatible API that shows, as the answer
// streams, which text came from an accepted draft and which the target wrote itself (the `spans` extension,
// docs/server.md), live figures, and a race of the same request with and without speculation.
// The API key lives in this script's memory only; server text is only ever set as textContent.
"use strict";

const state = {
  key: "",
  settings: null, // GET /v1/speculation
  messages: [], // the conversation so far: {role, content}
  sources: [], // drafter names seen, in order: each gets its own colour
};

const $ = (id) => document.getElementById(id);

class ServerError extends Error {}

function headers() {
  const result = { "Content-Type": "application/json" };
  if (state.key) result.Authorization = `Bearer ${state.key}`;
  return result;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) {
    // not JSON: fall back to the status line
  }
  return `the server answered ${response.status} ${response.statusText}`;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function loadSettings() {
  let response;
  try {
    response = await fetch("/v1/speculation", { headers: headers() });
  } catch (error) {
    showError(`cannot reach the server: ${error.message}`);
    return;
  }
  if (!response.ok) {
    showError(await errorMessage(response));
    return;
  }
  showError("");
  state.settings = await response.json();
  const s = state.settings;
  $("model-line").textContent =
    `${s.model}: drafter ${s.drafter}, k ${s.k}, up to ${s.max_batch} requests at once.`;
  fillSelect($("drafter"), s.drafters, s.drafter);
  const ks = ["auto", ...Array.from({ length: s.k_max + 1 }, (_, i) => String(i))];
  fillSelect($("k"), ks, String(s.k));
  $("max-tokens").value = Math.min(s.max_tokens, s.max_context); // the server's own default
}

function fillSelect(select, values, chosen) {
  select.replaceChildren(
    ...values.map((value) => {
      const option = document.createElement("option");
      option.value = value;
      option.textContent = value;
      option.selected = value === chosen;
      return option;
    }),
  );
}

function requestBody(prompt, quickdraft) {
  const body = {
    model: state.settings ? state.settings.model : "",
    messages: [...state.messages, { role: "user", content: prompt }],
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    quickdraft: { spans: true, ...quickdraft },
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  return body;
}

function chosenSpeculation() {
  const k = $("k").value;
  return { drafter: $("drafter").value, k: k === "auto" ? "auto" : Number(k) };
}

// One streamed chat completion; calls onSpans(spans) for every text chunk. Returns the whole answer and its
// timing; throws ServerError with the server's own message for a refused request or an error event.
async function streamChat(body, onSpans) {
  const started = performance.now();
  const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) throw new ServerError(await errorMessage(response));
  const result = { text: "", firstTokenSeconds: null, seconds: 0, speculation: null, usage: null, started };
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") {
        result.seconds = (performance.now() - started) / 1000;
        return result;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) throw new ServerError(chunk.error.message);
      if (chunk.speculation) result.speculation = chunk.speculation;
      if (chunk.usage) result.usage = chunk.usage;
      const content = chunk.choices && chunk.choices[0] && chunk.choices[0].delta.content;
      if (content) {
        if (result.firstTokenSeconds === null) result.firstTokenSeconds = (performance.now() - started) / 1000;
        result.text += content;
        onSpans(chunk.spans || [{ text: content, source: "target", tokens: 0 }]);
      }
    }
  }
  throw new ServerError("the stream ended before [DONE]; the server may have stopped");
}

function sourceIndex(source) {
  if (source === "target") return -1;
  if (!state.sources.includes(source)) {
    state.sources.push(source);
    const item = document.createElement("span");
    item.className = `piece drafted source-${(state.sources.length - 1) % 3}`;
    item.dataset.source = source;
    item.textContent = `accepted draft: ${source}`;
    $("legend").append(item);
  }
  return state.sources.indexOf(source);
}

function appendSpans(element, spans) {
  for (const span of spans) {
    if (!span.text) continue;
    const piece = document.createElement("span");
    const index = sourceIndex(span.source);
    piece.className = index < 0 ? "piece" : `piece drafted source-${index % 3}`;
    piece.dataset.source = span.source;
    piece.title = index < 0 ? "written by the target" : `drafted by ${span.source}, accepted by the target`;
    piece.textContent = span.text;
    element.append(piece);
  }
}

// Live figures from the spans: every target step writes exactly one token itself, so tau (tokens per
// target step) is all tokens over the target's own; the final figures come from the server's statistics.
function liveFigures() {
  const figures = { tokens: 0, target: 0, started: performance.now(), first: null };
  return {
    add(spans) {
      if (figures.first === null) figures.first = performance.now();
      for (const span of spans) {
        figures.tokens += span.tokens;
        if (span.source === "target") figures.target += span.tokens;
      }
      const seconds = (performance.now() - figures.started) / 1000;
      $("ttft").textContent = `${((figures.first - figures.started) / 1000).toFixed(2)} s`;
      $("rate").textContent = seconds > 0 ? (figures.tokens / seconds).toFixed(1) : "–";
      $("tau").textContent = figures.target ? (figures.tokens / figures.target).toFixed(2) : "–";
      $("drafted").textContent = `${figures.tokens - figures.target} of ${figures.tokens}`;
    },
    finish(result) {
      const s = result.speculation;
      const generated = result.usage ? result.usage.completion_tokens : figures.tokens;
      if (result.firstTokenSeconds !== null) $("ttft").textContent = `${result.firstTokenSeconds.toFixed(2)} s`;
      $("rate").textContent = (generated / result.seconds).toFixed(1);
      if (s) {
        $("tau").textContent = s.steps ? s.mean_accepted_length.toFixed(2) : "–";
        $("drafted").textContent = `${s.accepted_tokens} of ${generated}`;
        showAcceptance(s.acceptance_by_position);
      }
    },
  };
}

function showAcceptance(rates) {
  $("acceptance").replaceChildren(
    ...rates.map((rate, position) => {
      const item = document.createElement("li");
      const label = document.createElement("span");
      label.textContent = `#${position + 1}`;
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.style.width = `${Math.round(rate * 100)}%`;
      bar.append(fill);
      const value = document.createElement("span");
      value.textContent = `${Math.round(rate * 100)}%`;
      item.append(label, bar, value);
      return item;
    }),
  );
}

function addMessage(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  element.textContent = text;
  $("conversation").append(element);
  return element;
}

function busy(on) {
  for (const id of ["send", "race"]) $(id).disabled = on;
}

async function send() {
  const prompt = $("prompt").value.trim();
  if (!prompt || $("send").disabled) return; // Ctrl+Enter while an answer streams does nothing
  showError("");
  busy(true);
  const body = requestBody(prompt, chosenSpeculation());
  const user = addMessage("user", prompt);
  const answer = addMessage("assistant", "");
  const figures = liveFigures();
  try {
    const result = await streamChat(body, (spans) => {
      appendSpans(answer, spans);
      figures.add(spans);
      $("conversation").scrollTop = $("conversation").scrollHeight;
    });
    figures.finish(result);
    state.messages.push({ role: "user", content: prompt }, { role: "assistant", content: result.text });
    $("prompt").value = "";
  } catch (error) {
    user.remove();
    answer.remove();
    showError(error instanceof ServerError ? error.message : `the request failed: ${error.message}`);
  } finally {
    busy(false);
    $("prompt").focus();
  }
}

async function race() {
  const prompt = $("prompt").value.trim();
  if (!prompt || $("race").disabled) return;
  showError("");
  busy(true);
  $("race-panel").hidden = false;
  const verdict = $("race-verdict");
  verdict.textContent = "";
  verdict.className = "verdict";
  const lanes = [
    { name: "spec", quickdraft: chosenSpeculation() },
    { name: "plain", quickdraft: { drafter: "none" } },
  ];
  for (const lane of lanes) {
    $(`race-${lane.name}-text`).replaceChildren();
    $(`race-${lane.name}-time`).textContent = "running…";
  }
  try {
    const results = await Promise.all(
      lanes.map(async (lane) => {
        const result = await streamChat(requestBody(prompt, lane.quickdraft), (spans) =>
          appendSpans($(`race-${lane.name}-text`), spans),
        );
        const tokens = result.usage ? result.usage.completion_tokens : 0;
        $(`race-${lane.name}-time`).textContent =
          `finished in ${result.seconds.toFixed(2)} s, ${(tokens / result.seconds).toFixed(1)} tokens/s`;
        return result;
      }),
    );
    const [spec, plain] = results;
    const speedup = `${(plain.seconds / spec.seconds).toFixed(2)}x the target alone`;
    if (Number($("temperature").value) === 0) {
      const same = spec.text === plain.text;
      verdict.className = `verdict ${same ? "same" : "differ"}`;
      verdict.textContent = same
        ? `Identical texts (greedy), ${speedup}.`
        : `The texts differ: greedy decoding should give the same text; please report this. ${speedup}.`;
    } else {
      verdict.textContent =
        `Sampling: both follow the target's distribution, but speculation draws its random numbers differently ` +
        `(for drafts and for rejections), so the texts may differ even with one seed. ${speedup}.`;
    }
  } catch (error) {
    showError(error instanceof ServerError ? error.message : `the request failed: ${error.message}`);
  } finally {
    busy(false);
  }
}

function clearChat() {
  state.messages = [];
  $("conversation").replaceChildren();
  $("acceptance").replaceChildren();
  for (const id of ["ttft", "rate", "tau", "drafted"]) $(id).textContent = "–";
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("send").addEventListener("click", send);
  $("race").addEventListener("click", race);
  $("clear").addEventListener("click", clearChat);
  $("settings").addEventListener("submit", (event) => event.preventDefault());
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      send();
    }
  });
  $("api-key").addEventListener("change", () => {
    state.key = $("api-key").value.trim();
    loadSettings();
  });
  loadSettings();
});
