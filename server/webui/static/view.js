// How one message looks: Markdown content, reasoning folded, tool calls as
// blocks, the answer's figures and its error. Every string is set as text
// (markdown.js builds nodes; nothing is parsed as HTML).

import { codeBlock, render } from "./markdown.js";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function toolBlock(call) {
  const fn = call.function || {};
  let args = fn.arguments || "";
  try {
    args = JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    // still streaming, or not JSON: shown as it came
  }
  const block = el("div", "tool-call");
  block.append(el("div", "tool-name", "Tool call: " + (fn.name || "?")));
  block.append(codeBlock(args, "json"));
  return block;
}

function pretty(args) {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args || "";
  }
}

// A call the server ran with an MCP tool: folded, its status on the fold.
function mcpBlock(call) {
  const block = el("details", "mcp-call");
  block.dataset.status = call.status || "";
  const mark = { completed: "✓", failed: "✗" }[call.status] || "…";
  block.append(el("summary", null, mark + " " + call.server + "." + call.name));
  block.append(codeBlock(pretty(call.arguments), "json"));
  if (call.error) block.append(el("div", "mcp-error", call.error));
  else if (call.output != null) block.append(el("pre", "mcp-output", call.output));
  return block;
}

// A call waiting for the user's yes: Approve and Decline, then the choice.
function approvalBlock(asked) {
  const block = el("div", "mcp-approval");
  block.dataset.state = asked.state;
  block.append(el("div", "tool-name", "Run " + asked.server + "." + asked.name + "?"));
  block.append(codeBlock(pretty(asked.arguments), "json"));
  if (asked.state === "asked") {
    for (const [label, yes] of [["Approve", "1"], ["Decline", "0"]]) {
      const button = el("button", yes === "1" ? "approve" : "decline", label);
      button.type = "button";
      button.dataset.approval = asked.id;
      button.dataset.approve = yes;
      block.append(button);
    }
  } else block.append(el("span", "mcp-choice", asked.state));
  return block;
}

function figures(stats) {
  const parts = [];
  if (stats.tokens != null) parts.push(stats.tokens + " tokens");
  if (stats.tokPerS != null) parts.push(stats.tokPerS.toFixed(1) + " tok/s");
  if (stats.ttftMs != null) parts.push("first token " + Math.round(stats.ttftMs) + " ms");
  if (stats.cached != null) parts.push(stats.cached + "/" + stats.prompt + " prompt tokens cached");
  if (stats.finish) parts.push(stats.finish);
  return parts.join(" · ");
}

// The parts of a message element, filled from `msg` (called again as an
// answer streams in).
export function fill(node, msg) {
  const parts = node._parts;
  if (msg.reasoning) {
    parts.reasoning.hidden = false;
    parts.reasoningText.textContent = msg.reasoning;
  }
  parts.mcp.replaceChildren(...(msg.mcp || []).map(mcpBlock),
                           ...(msg.approvals || []).map(approvalBlock));
  render(parts.content, msg.content || "");
  parts.tools.replaceChildren(...(msg.toolCalls || []).map(toolBlock));
  parts.stats.textContent = msg.stats ? figures(msg.stats) : "";
  parts.error.hidden = !msg.error;
  parts.error.textContent = msg.error || "";
}

export function messageNode(msg) {
  const node = el("div", "msg " + msg.role);
  node.append(el("div", "who", msg.role === "user" ? "You" : (msg.model || "Assistant")));
  const reasoning = el("details", "reasoning");
  reasoning.hidden = true;
  reasoning.append(el("summary", null, "Reasoning"));
  const reasoningText = el("div", "reasoning-text");
  reasoning.append(reasoningText);
  const mcp = el("div", "mcp");
  const content = el("div", "content");
  const tools = el("div", "tools");
  const error = el("div", "error");
  const stats = el("div", "stats");
  node.append(reasoning, mcp, content, tools, error, stats);
  node._parts = { reasoning, reasoningText, mcp, content, tools, error, stats };
  node._msg = msg;
  if (msg.role === "user") {
    content.classList.add("plain");     // a person's text, shown as typed
    content.textContent = msg.content;
  } else fill(node, msg);
  return node;
}

// The answer's figures from its timings and the response's usage.
export function answerStats(usage, t0, tFirst, tEnd, finish) {
  const stats = { finish: finish || null };
  if (tFirst != null) stats.ttftMs = tFirst - t0;
  if (usage) {
    stats.tokens = usage.completion_tokens;
    stats.prompt = usage.prompt_tokens;
    stats.cached = usage.prompt_tokens_details?.cached_tokens ?? 0;
    const secs = (tEnd - (tFirst ?? t0)) / 1000;
    if (secs > 0 && usage.completion_tokens > 1) stats.tokPerS = (usage.completion_tokens - 1) / secs;
  }
  return stats;
}
