// What the page keeps in the browser's localStorage: the conversations, the
// settings and the API key. Nothing of it leaves the browser but the
// messages of the conversation being answered, sent to this server.

const CONVERSATIONS = "llmctl.conversations";
const CURRENT = "llmctl.current";
const SETTINGS = "llmctl.settings";
const KEY = "llmctl.apiKey";

export const DEFAULT_SETTINGS = {
  model: "", system: "", temperature: 0.7, maxTokens: 512, json: false, tools: "", mcp: true,
};

function read(name, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(name));
    return value ?? fallback;
  } catch {
    return fallback;            // a value another version wrote, or a hand edit
  }
}

export function apiKey() {
  return localStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(SETTINGS, {}) };
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

// The conversations, newest first: [{id, title, created, messages}], each
// message {role, content, reasoning?, toolCalls?, stats?, error?, model?}.
export class Conversations {
  constructor() {
    const all = read(CONVERSATIONS, []);
    this.list = Array.isArray(all) ? all.filter((c) => c && Array.isArray(c.messages)) : [];
    this.currentId = localStorage.getItem(CURRENT);
    if (!this.current()) this.currentId = this.list.length ? this.list[0].id : null;
  }

  current() {
    return this.list.find((c) => c.id === this.currentId) || null;
  }

  create() {
    const id = (crypto.randomUUID ? crypto.randomUUID() : String(Date.now() + Math.random()));
    const conv = { id, title: "New chat", created: Date.now(), messages: [] };
    this.list.unshift(conv);
    this.select(id);
    return conv;
  }

  // The current conversation, a new one when there is none.
  ensure() {
    return this.current() || this.create();
  }

  select(id) {
    this.currentId = id;
    this.save();
  }

  rename(id, title) {
    const conv = this.list.find((c) => c.id === id);
    if (conv && title.trim()) {
      conv.title = title.trim().slice(0, 200);
      this.save();
    }
  }

  remove(id) {
    this.list = this.list.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.list.length ? this.list[0].id : null;
    this.save();
  }

  save() {
    localStorage.setItem(CONVERSATIONS, JSON.stringify(this.list));
    if (this.currentId) localStorage.setItem(CURRENT, this.currentId);
    else localStorage.removeItem(CURRENT);
  }

  // Every conversation as a JSON file the browser downloads.
  export() {
    const blob = new Blob([JSON.stringify(this.list, null, 2)], { type: "application/json" });
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "llmctl-conversations.json";
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
  }
}
