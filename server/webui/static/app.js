// The chat page: model picker, composer, streaming answers, settings and
// the API key prompt. Calls go only to this server (api.js); state lives
// in the browser's storage (store.js); messages are drawn by view.js.

import * as api from "./api.js";
import * as store from "./store.js";
import { drawList } from "./sidebar.js";
import { approvalBody, responsesBody, streamMcp } from "./mcp.js";
import { answerStats, fill, messageNode } from "./view.js";

const $ = (id) => document.getElementById(id);
const convs = new store.Conversations();
const settings = store.loadSettings();
let models = [];                // GET /webui/models' list
let running = null;             // the AbortController of the answer streaming now
let mcpServers = [];            // the MCP servers the server runs tools of (serve --mcp)

function setStatus(text, state) {
  const status = $("model-status");
  status.textContent = text;
  status.dataset.state = state || "";
}

function mib(bytes) {
  return bytes == null ? "" : (bytes / 1048576).toFixed(0) + " MiB";
}

function showModels() {
  $("model").replaceChildren(...models.map((m) => {
    const option = document.createElement("option");
    option.value = m.name;
    option.textContent = m.name + (m.loaded ? "  (loaded, " + mib(m.bytes) + ")"
      : m.loading ? "  (loading)" : "");
    return option;
  }));
  $("model").value = settings.model;
  const m = models.find((x) => x.name === settings.model);
  if (!m) setStatus("no model", "error");
  else if (m.loaded) setStatus("loaded, " + mib(m.bytes), "loaded");
  else if (m.loading) setStatus("loading " + m.name + "…", "loading");
  else setStatus("not loaded: it loads on the first message", "idle");
}

async function refreshModels() {
  const data = await api.listModels();
  models = data.models;
  mcpServers = data.mcp || [];
  $("mcp-row").hidden = !mcpServers.length;
  $("mcp-names").textContent = mcpServers.map((s) => s.label).join(", ");
  if (!models.some((m) => m.name === settings.model)) {
    settings.model = models.some((m) => m.name === data.default) ? data.default
      : (models[0] || {}).name || "";
  }
  showModels();
}

async function pickModel(name) {
  settings.model = name;
  store.saveSettings(settings);
  const m = models.find((x) => x.name === name);
  if (m && m.loaded) {
    showModels();
    return;
  }
  setStatus("loading " + name + "…", "loading");
  $("model").disabled = true;
  $("send").disabled = true;
  try {
    await api.loadModel(name);
    await refreshModels();
  } catch (e) {
    setStatus("could not load " + name + ": " + e.message, "error");
    if (e.status === 401) askKey("The server refused the key: " + e.message);
  } finally {
    $("model").disabled = false;
    $("send").disabled = false;
  }
}

function scrollDown() {
  const box = $("messages");
  box.scrollTop = box.scrollHeight;
}

function showConversation() {
  const conv = convs.current();
  $("messages").replaceChildren(...(conv ? conv.messages.map(messageNode) : []));
  drawList($("conv-list"), convs, showConversation);
  scrollDown();
}

function requestBody(conv) {
  const messages = [];
  if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
  for (const m of conv.messages.slice(0, -1)) {     // all but the answer to come
    if (m.role === "assistant" && !m.content) continue;   // failed or stopped early
    messages.push({ role: m.role, content: m.content });
  }
  const body = { model: settings.model, messages, temperature: Number(settings.temperature),
                 max_tokens: Number(settings.maxTokens) };
  if (settings.json) body.response_format = { type: "json_object" };
  if (settings.tools.trim()) {
    let tools;
    try {
      tools = JSON.parse(settings.tools);
    } catch (e) {
      throw new Error("the Tools setting is not JSON: " + e.message);
    }
    if (!Array.isArray(tools)) throw new Error("the Tools setting must be a JSON array");
    body.tools = tools;
  }
  return body;
}

function applyDelta(answer, d) {
  if (d.content) answer.content += d.content;
  if (d.reasoning_content) answer.reasoning = (answer.reasoning || "") + d.reasoning_content;
  for (const tc of d.tool_calls || []) {
    answer.toolCalls = answer.toolCalls || [];
    const i = tc.index ?? answer.toolCalls.length;
    const call = answer.toolCalls[i] ||= { id: "", type: "function",
                                           function: { name: "", arguments: "" } };
    if (tc.id) call.id = tc.id;
    if (tc.function?.name) call.function.name += tc.function.name;
    if (tc.function?.arguments) call.function.arguments += tc.function.arguments;
  }
}

function describe(e) {
  if (e.status === 0) return e.message;             // already says the connection was lost
  return e.status ? "Error " + e.status + ": " + e.message : "Error: " + e.message;
}

function setRunning(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  document.body.dataset.streaming = on ? "1" : "";
}

// Stream an answer into `answer` (drawn in `node`): `run(signal, on)`
// asks the server and returns {usage, finish}.
async function answerInto(answer, node, run) {
  const controller = new AbortController();
  running = controller;
  setRunning(true);
  const t0 = performance.now();
  let tFirst = null;
  let painting = false;
  const paint = () => {
    if (painting) return;
    painting = true;
    requestAnimationFrame(() => {
      painting = false;
      fill(node, answer);
      scrollDown();
    });
  };
  try {
    const { usage, finish } = await run(controller.signal, {
      first: () => { tFirst = tFirst ?? performance.now(); },
      delta: paint,
    });
    answer.stats = answerStats(usage, t0, tFirst, performance.now(), finish);
  } catch (e) {
    if (e.name === "AbortError") answer.stats = answerStats(null, t0, tFirst, 0, "stopped");
    else answer.error = describe(e);
    if (e.status === 401) askKey("The server refused the key: " + e.message);
  } finally {
    running = null;
    setRunning(false);
    fill(node, answer);
    convs.save();
    scrollDown();
  }
  refreshModels().catch(() => {});   // the answer may have loaded its model
}

// The server's MCP servers, when the setting uses them.
function usedMcp() {
  return settings.mcp ? mcpServers : [];
}

async function send() {
  const text = $("input").value;
  if (!text.trim() || running) return;
  const conv = convs.ensure();
  conv.messages.push({ role: "user", content: text });
  if (conv.title === "New chat") conv.title = text.trim().slice(0, 40);
  const answer = { role: "assistant", content: "", model: settings.model };
  conv.messages.push(answer);
  convs.save();
  $("input").value = "";
  showConversation();
  const node = $("messages").lastElementChild;
  const picked = models.find((m) => m.name === settings.model);
  if (picked && !picked.loaded) setStatus("loading " + picked.name + "…", "loading");
  let body;
  try {
    body = requestBody(conv);
  } catch (e) {
    answer.error = describe(e);
    fill(node, answer);
    return;
  }
  const servers = usedMcp();
  await answerInto(answer, node, servers.length
    ? (signal, on) => streamMcp(responsesBody(body, servers), signal, answer, on)
    : (signal, on) => api.streamChat(body, signal, {
      first: on.first, delta: (d) => { applyDelta(answer, d); on.delta(); } }));
}

// An Approve or Decline button of an MCP call: the answer goes on.
async function decide(node, id, approve) {
  const answer = node._msg;
  const asked = (answer.approvals || []).find((a) => a.id === id);
  if (!asked || asked.state !== "asked" || running) return;
  asked.state = approve ? "approved" : "declined";
  answer.error = null;
  fill(node, answer);
  const body = approvalBody(answer, id, approve, usedMcp(), settings);
  await answerInto(answer, node, (signal, on) => streamMcp(body, signal, answer, on));
}

function stop() {
  if (running) running.abort();   // the server cancels the generation on disconnect
}

function askKey(problem) {
  $("key-error").hidden = !problem;
  $("key-error").textContent = problem || "";
  if (!$("key-dialog").open) $("key-dialog").showModal();
  $("key-input").focus();
}

// Load the model list; false (after saying why) when the server refuses or is gone.
async function connect() {
  try {
    await refreshModels();
    return true;
  } catch (e) {
    if (e.status === 401) askKey(store.apiKey() ? "The server refused the key: " + e.message : "");
    else setStatus(describe(e), "error");
    return false;
  }
}

function ready() {
  document.body.dataset.ready = "1";
  performance.mark("llmctl-ready");
}

function bindSettings() {
  const fields = { system: "system", temperature: "temperature", "max-tokens": "maxTokens" };
  for (const [id, key] of Object.entries(fields)) {
    $(id).value = settings[key];
    for (const kind of ["input", "change"]) {     // typed, or cleared and left
      $(id).addEventListener(kind, () => {
        settings[key] = $(id).value;
        store.saveSettings(settings);
      });
    }
  }
  $("mcp").checked = settings.mcp;
  $("mcp").addEventListener("change", () => {
    settings.mcp = $("mcp").checked;
    store.saveSettings(settings);
  });
  $("json").checked = settings.json;
  $("json").addEventListener("change", () => {
    settings.json = $("json").checked;
    store.saveSettings(settings);
  });
  $("tools").value = settings.tools;
  for (const kind of ["input", "change"]) {
    $("tools").addEventListener(kind, () => {
      settings.tools = $("tools").value;
      store.saveSettings(settings);
    });
  }
}

function bindControls() {
  $("model").addEventListener("change", () => pickModel($("model").value));
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    send();
  });
  $("stop").addEventListener("click", stop);
  $("messages").addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-approval]");
    if (button) decide(button.closest(".msg"), button.dataset.approval, button.dataset.approve === "1");
  });
  $("input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && running) {
      ev.preventDefault();
      stop();
    }
  });
  $("new-conv").addEventListener("click", () => {
    convs.create();
    showConversation();
    $("input").focus();
  });
  $("export").addEventListener("click", () => convs.export());
  $("forget-key").addEventListener("click", () => {
    store.setApiKey("");
    askKey("");
  });
  // Esc in the key prompt would leave a page that can do nothing: it stays.
  $("key-dialog").addEventListener("cancel", (ev) => ev.preventDefault());
  $("key-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    store.setApiKey($("key-input").value.trim());
    $("key-dialog").close();
    if (await connect()) ready();
  });
}

async function main() {
  bindSettings();
  bindControls();
  showConversation();
  if (await connect()) ready();
}

main();
