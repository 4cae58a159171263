// The page's client of the server's own OpenAI routes: /v1/models and streamed /v1/chat/completions
// (server-sent events). Same-origin requests only (the page's CSP allows no other). With --api-key each
// call carries `Authorization: Bearer`; a 401 asks the user for the key (app.js) and tries again.

import { loadKey, saveKey } from "./store.js";

let askForKey = null; // async (reason) => resolves once the user gave a key

export function onKeyNeeded(ask) {
  askForKey = ask;
}

export async function api(path, options = {}) {
  for (let attempt = 0; ; attempt++) {
    const key = loadKey();
    const headers = { ...(options.headers || {}) };
    if (key) headers.Authorization = "Bearer " + key;
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401 || !askForKey || attempt >= 5) return response;
    saveKey("");
    await askForKey(key ? "The server refused that key." : "");
  }
}

async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    return (body.error && (body.error.message || body.error)) || text;
  } catch {
    return text || response.statusText;
  }
}

export async function listModels() {
  const response = await api("/v1/models");
  if (!response.ok) throw new Error(`models: ${response.status} ${await errorText(response)}`);
  return (await response.json()).data.map((m) => m.id);
}

// One event's data lines, joined as the SSE format says; null for comments and empty events.
function eventData(event) {
  const lines = event.split("\n").filter((l) => l.startsWith("data:"));
  return lines.length ? lines.map((l) => l.slice(5).replace(/^ /, "")).join("\n") : null;
}

// Streams one chat completion, calling onDelta({content, reasoning}) per piece; resolves to the finish
// reason. Aborting `signal` rejects with an AbortError and closes the connection: the server then
// cancels the generation.
export async function streamChat(body, signal, onDelta) {
  const response = await api("/v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!response.ok) throw new Error(`${response.status}: ${await errorText(response)}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  let finish = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = pending.indexOf("\n\n")) >= 0) {
      const data = eventData(pending.slice(0, cut));
      pending = pending.slice(cut + 2);
      if (data === null || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue; // a usage-only chunk
      const delta = choice.delta || {};
      onDelta({ content: delta.content || "", reasoning: delta.reasoning_content || "" });
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return finish;
}
