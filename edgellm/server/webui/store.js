// What the page keeps: conversations and settings in localStorage (they survive a reload and a restart
// of the browser), the API key in sessionStorage (gone with the tab). An imported file is untrusted:
// only the fields the page knows, of the types it expects, are kept; the renderer treats their text as
// text anyway (markdown.js).

const CONVERSATIONS = "edgellm.conversations";
const SETTINGS = "edgellm.settings";
const API_KEY = "edgellm.apiKey";
const ROLES = new Set(["user", "assistant"]);
const MAX_TITLE = 60;

export const DEFAULT_SETTINGS = { model: "", system: "", temperature: 0.7, top_p: 0.95, max_tokens: 512, theme: "" };

function readJson(storage, key, fallback) {
  try {
    const value = JSON.parse(storage.getItem(key));
    return value === null ? fallback : value;
  } catch {
    return fallback; // missing or corrupt: start over rather than fail to load the page
  }
}

export function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export function titleOf(conversation) {
  const first = conversation.messages.find((m) => m.role === "user");
  const text = first ? first.content.replace(/\s+/g, " ").trim() : "";
  return text ? text.slice(0, MAX_TITLE) : "Untitled chat";
}

function str(value, fallback = "") {
  return typeof value === "string" ? value : fallback;
}

function cleanMessage(raw) {
  if (!raw || typeof raw !== "object" || !ROLES.has(raw.role)) return null;
  const message = { role: raw.role, content: str(raw.content) };
  if (raw.role === "assistant") {
    if (typeof raw.reasoning === "string" && raw.reasoning) message.reasoning = raw.reasoning;
    if (typeof raw.model === "string") message.model = raw.model;
    if (raw.stopped === true) message.stopped = true;
    if (typeof raw.error === "string") message.error = raw.error;
  }
  return message;
}

// A conversation as the page stores it, from anything (a file, a storage edited by hand); null if it is not one.
export function cleanConversation(raw) {
  if (!raw || typeof raw !== "object" || !Array.isArray(raw.messages)) return null;
  const messages = raw.messages.map(cleanMessage).filter(Boolean);
  const id = typeof raw.id === "string" && /^[\w-]{1,64}$/.test(raw.id) ? raw.id : newId();
  const updated = Number.isFinite(raw.updated) ? raw.updated : Date.now();
  return { id, title: str(raw.title).slice(0, MAX_TITLE) || titleOf({ messages }), messages, updated };
}

export function loadConversations() {
  const raw = readJson(localStorage, CONVERSATIONS, []);
  return (Array.isArray(raw) ? raw : []).map(cleanConversation).filter(Boolean);
}

export function saveConversations(conversations) {
  const kept = conversations.filter((c) => c.messages.length);
  localStorage.setItem(CONVERSATIONS, JSON.stringify(kept));
}

// Conversations from an exported file (one conversation or a list, or {conversations: [...]}), with new
// ids where they clash with the ones already here: an import adds, it never overwrites.
export function parseImport(text, existing) {
  let data = JSON.parse(text);
  if (data && Array.isArray(data.conversations)) data = data.conversations;
  const list = (Array.isArray(data) ? data : [data]).map(cleanConversation).filter(Boolean);
  const taken = new Set(existing.map((c) => c.id));
  for (const c of list) {
    if (taken.has(c.id)) c.id = newId();
    taken.add(c.id);
  }
  return list;
}

export function exportJson(conversations) {
  const payload = { format: "edgellm-chat", version: 1, conversations };
  return JSON.stringify(payload, null, 2);
}

export function loadSettings() {
  const raw = readJson(localStorage, SETTINGS, {});
  const settings = { ...DEFAULT_SETTINGS };
  for (const [key, fallback] of Object.entries(DEFAULT_SETTINGS)) {
    if (raw && typeof raw[key] === typeof fallback) settings[key] = raw[key];
  }
  return settings;
}

export function saveSettings(settings) {
  localStorage.setItem(SETTINGS, JSON.stringify(settings));
}

export function loadKey() {
  return sessionStorage.getItem(API_KEY) || "";
}

export function saveKey(key) {
  if (key) sessionStorage.setItem(API_KEY, key);
  else sessionStorage.removeItem(API_KEY);
}
