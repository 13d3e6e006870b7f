// The page's calls to its own server (connect-src 'self'): the model list,
// a model load and a streamed chat completion. Errors come back as
// ApiError with the server's own message, or as a lost connection.

import { apiKey } from "./store.js";

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;       // 0: no answer (the connection was lost); null: mid-stream
  }
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// The message of an error body in OpenAI's shape ({"error": {"message"}}),
// Ollama's ({"error": "..."}), or the raw text.
function errorMessage(text) {
  try {
    const body = JSON.parse(text);
    const e = body.error ?? body.detail ?? body;
    return typeof e === "string" ? e : e.message || JSON.stringify(e);
  } catch {
    return text || "no message";
  }
}

async function call(path, init = {}) {
  let response;
  try {
    response = await fetch(path, { ...init, headers: headers() });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError("connection lost: the server did not answer (" + e.message + ")", 0);
  }
  if (!response.ok) {
    throw new ApiError(errorMessage(await response.text()), response.status);
  }
  return response;
}

export async function listModels() {
  return (await call("/webui/models")).json();
}

export async function loadModel(model) {
  return (await call("/webui/load", { method: "POST", body: JSON.stringify({ model }) })).json();
}

// The SSE events of a response body, parsed; a `data: [DONE]` ends them.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError("connection lost while the answer was streaming", 0);
    }
    if (chunk.done) break;
    buffer += decoder.decode(chunk.value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      yield JSON.parse(data);
    }
  }
  throw new ApiError("connection lost: the stream ended before the answer did", 0);
}

// Stream a chat completion: `on.delta(choiceDelta)` for each delta,
// `on.first()` at the first token, and the usage object is returned.
export async function streamChat(body, signal, on) {
  const response = await call("/v1/chat/completions", {
    method: "POST", signal,
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  let usage = null;
  let finish = null;
  let first = true;
  for await (const event of events(response)) {
    if (event.error) throw new ApiError(errorMessage(JSON.stringify(event)), null);
    if (event.usage) usage = event.usage;
    for (const choice of event.choices || []) {
      const d = choice.delta;
      if (d) {
        if (first && (d.content || d.reasoning_content || d.tool_calls)) {
          on.first();
          first = false;
        }
        on.delta(d);
      }
      finish = choice.finish_reason || finish;
    }
  }
  return { usage, finish };
}

// Stream a Responses API answer (the server runs its MCP tools for it):
// `on.event(event)` for each typed event; the final response object is
// returned. An `error` event or a failed response throws.
export async function streamResponse(body, signal, on) {
  const response = await call("/v1/responses", {
    method: "POST", signal, body: JSON.stringify({ ...body, stream: true }),
  });
  let final = null;
  for await (const event of events(response)) {
    if (event.type === "error") throw new ApiError(event.message || "the answer failed", null);
    if (event.type === "response.failed") {
      throw new ApiError(event.response?.error?.message || "the answer failed", null);
    }
    if (event.type === "response.completed" || event.type === "response.incomplete") {
      final = event.response;
    }
    on.event(event);
    if (final) return final;
  }
  return final;
}
