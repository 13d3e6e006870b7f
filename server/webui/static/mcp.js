// MCP tools the server runs (`llmctl serve --mcp`): with them, an answer is
// asked of /v1/responses with each configured server as an `mcp` tool. A
// tool that says it only reads runs at once; any other waits for the
// Approve button, whose answer goes back as an mcp_approval_response.

import * as api from "./api.js";

export function mcpTools(servers) {
  return servers.map((s) => ({ type: "mcp", server_label: s.label,
                               require_approval: { never: { read_only: true } } }));
}

// The Responses body for a chat body (the page's usual request).
export function responsesBody(chat, servers) {
  const system = chat.messages.find((m) => m.role === "system");
  const body = {
    model: chat.model, temperature: chat.temperature, max_output_tokens: chat.max_tokens,
    input: chat.messages.filter((m) => m.role !== "system")
      .map((m) => ({ role: m.role, content: m.content })),
    tools: mcpTools(servers).concat((chat.tools || []).map((t) => ({
      type: "function", name: t.function?.name, description: t.function?.description,
      parameters: t.function?.parameters }))),
  };
  if (system) body.instructions = system.content;
  if (chat.response_format) body.text = { format: chat.response_format };
  return body;
}

// What answering the approval `id` sends: the previous response continues.
export function approvalBody(answer, id, approve, servers, settings) {
  return {
    model: answer.model, previous_response_id: answer.responseId,
    temperature: Number(settings.temperature), max_output_tokens: Number(settings.maxTokens),
    input: [{ type: "mcp_approval_response", approval_request_id: id, approve }],
    tools: mcpTools(servers),
  };
}

function callOf(answer, id) {
  answer.mcp = answer.mcp || [];
  let call = answer.mcp.find((c) => c.id === id);
  if (!call) {
    call = { id, server: "", name: "", arguments: "", output: null, error: null,
             status: "in_progress" };
    answer.mcp.push(call);
  }
  return call;
}

function itemInto(answer, item) {
  if (item.type === "mcp_call") {
    const call = callOf(answer, item.id);
    Object.assign(call, { server: item.server_label, name: item.name, status: item.status });
    if (item.arguments) call.arguments = item.arguments;
    if (item.output != null) call.output = item.output;
    if (item.error) {
      call.error = (item.error.content || []).map((p) => p.text).join(" ")
        || item.error.message || JSON.stringify(item.error);
    }
  } else if (item.type === "mcp_approval_request") {
    answer.approvals = answer.approvals || [];
    if (!answer.approvals.some((a) => a.id === item.id)) {
      answer.approvals.push({ id: item.id, server: item.server_label, name: item.name,
                              arguments: item.arguments, state: "asked" });
    }
  } else if (item.type === "function_call") {
    answer.toolCalls = answer.toolCalls || [];
    answer.toolCalls.push({ id: item.call_id, type: "function",
                            function: { name: item.name, arguments: item.arguments } });
  }
}

// Fold one Responses event into `answer`; true when it is output text
// (for the time to the first token).
export function applyEvent(answer, ev) {
  switch (ev.type) {
    case "response.output_text.delta":
      answer.content += ev.delta;
      return true;
    case "response.reasoning_text.delta":
      answer.reasoning = (answer.reasoning || "") + ev.delta;
      return true;
    case "response.mcp_call_arguments.delta":
      callOf(answer, ev.item_id).arguments += ev.delta;
      return false;
    case "response.output_item.added":
    case "response.output_item.done":
      itemInto(answer, ev.item);
      return false;
    default:
      return false;
  }
}

// Stream `body` into `answer`; the usage in chat's terms, for the figures.
export async function streamMcp(body, signal, answer, on) {
  const final = await api.streamResponse(body, signal, {
    event: (ev) => {
      if (applyEvent(answer, ev)) on.first();
      on.delta();
    },
  });
  if (!final) return { usage: null, finish: null };
  answer.responseId = final.id;
  const u = final.usage;
  const usage = u && { completion_tokens: u.output_tokens, prompt_tokens: u.input_tokens,
                       prompt_tokens_details: { cached_tokens:
                         u.input_tokens_details?.cached_tokens ?? 0 } };
  const asked = (answer.approvals || []).some((a) => a.state === "asked");
  return { usage, finish: asked ? "waiting for approval" : final.status };
}
