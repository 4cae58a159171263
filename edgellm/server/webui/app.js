// The chat page: conversations (store.js), the server's OpenAI routes (chat.js), replies rendered as
// Markdown built from DOM nodes (markdown.js). Model text is only ever set as textContent.

import { listModels, onKeyNeeded, streamChat } from "./chat.js";
import { copyText, el, renderMarkdown } from "./markdown.js";
import * as store from "./store.js";

const EMPTY_HINT = "Ask anything. Enter sends, Shift+Enter adds a line, Esc stops.";
const $ = (id) => document.getElementById(id);
const state = {
  conversations: store.loadConversations(),
  currentId: null,
  settings: store.loadSettings(),
  controller: null, // the AbortController of the reply streaming now, if any
  live: null, // the assistant message it writes into
  editing: -1, // the index of the user message being edited
};

function button(label, onClick, className) {
  const b = el("button", className, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function current() {
  let conversation = state.conversations.find((c) => c.id === state.currentId);
  if (!conversation) {
    conversation = { id: store.newId(), title: "Untitled chat", messages: [], updated: Date.now() };
    state.conversations.unshift(conversation);
    state.currentId = conversation.id;
  }
  return conversation;
}

function save() {
  try {
    store.saveConversations(state.conversations);
  } catch (e) {
    setStatus(`Not saved: ${e.message} (export and delete old chats to make room)`); // storage full
  }
  renderList();
}

function setStatus(text) {
  $("status").textContent = text;
}

// ---- rendering ----------------------------------------------------------------------------------

function renderList() {
  const list = $("conversations");
  list.replaceChildren();
  const shown = state.conversations.filter((c) => c.messages.length || c.id === state.currentId);
  for (const c of shown.sort((a, b) => b.updated - a.updated)) {
    const item = el("li", c.id === state.currentId ? "active" : "");
    const open = button(c.title || "Untitled chat", () => openConversation(c.id), "open");
    open.title = c.title;
    if (c.id === state.currentId) open.setAttribute("aria-current", "true");
    const remove = button("×", () => deleteConversation(c.id), "delete");
    remove.setAttribute("aria-label", "Delete conversation");
    item.append(open, remove);
    list.append(item);
  }
}

const unfolded = new WeakSet(); // the messages whose reasoning the user opened: re-renders keep it open

function fillAssistant(body, message) {
  body.replaceChildren();
  if (message.reasoning) {
    const fold = el("details", "reasoning");
    fold.open = unfolded.has(message);
    fold.addEventListener("toggle", () => (fold.open ? unfolded.add(message) : unfolded.delete(message)));
    fold.append(el("summary", null, message === state.live && !message.content ? "Thinking…" : "Reasoning"));
    fold.append(el("div", "reasoning-text", message.reasoning));
    body.append(fold);
  }
  const content = el("div", "content");
  renderMarkdown(message.content, content);
  if (message === state.live && !message.content && !message.reasoning) content.append(el("span", "typing", "…"));
  body.append(content);
  if (message.error) body.append(el("div", "error", message.error));
  const notes = [message.model, message.stopped ? "stopped" : ""].filter(Boolean).join(" · ");
  if (notes) body.append(el("div", "meta", notes));
}

function messageNode(message, index, conversation) {
  const node = el("article", "message " + message.role);
  node.dataset.role = message.role;
  const body = el("div", "bubble");
  const actions = el("div", "actions");
  const busy = Boolean(state.controller);
  if (message.role === "user" && state.editing === index) {
    const area = el("textarea", "edit-box");
    area.value = message.content;
    area.setAttribute("aria-label", "Edit message");
    area.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        resendEdited(index, area.value);
      }
    });
    body.append(area);
    actions.append(button("Save and send", () => resendEdited(index, area.value), "primary"));
    actions.append(button("Cancel", () => ((state.editing = -1), renderMessages())));
    setTimeout(() => area.focus());
  } else if (message.role === "user") {
    body.append(el("div", "user-text", message.content));
    if (!busy) actions.append(button("Edit", () => ((state.editing = index), renderMessages())));
  } else {
    fillAssistant(body, message);
    if (message === state.live) node.dataset.live = "true";
    const last = index === conversation.messages.length - 1;
    if (!busy && last) actions.append(button("Regenerate", regenerate));
    if (message.content) actions.append(button("Copy", () => copyText(message.content)));
  }
  node.append(body, actions);
  return node;
}

function renderMessages() {
  const box = $("messages");
  const conversation = current();
  box.replaceChildren();
  if (!conversation.messages.length) box.append(el("p", "empty", EMPTY_HINT));
  conversation.messages.forEach((m, i) => box.append(messageNode(m, i, conversation)));
  box.scrollTop = box.scrollHeight;
}

let pendingFrame = 0;
function renderLive() {
  // One re-render per frame however fast the tokens come.
  if (pendingFrame) return;
  pendingFrame = requestAnimationFrame(() => {
    pendingFrame = 0;
    const box = $("messages");
    const node = box.querySelector('[data-live="true"] .bubble');
    if (!node || !state.live) return;
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    fillAssistant(node, state.live);
    if (atBottom) box.scrollTop = box.scrollHeight;
  });
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").hidden = !busy;
  $("model").disabled = busy;
}

// ---- generation -----------------------------------------------------------------------------------

function numberOr(id, fallback) {
  const value = parseFloat($(id).value);
  return Number.isFinite(value) ? value : fallback;
}

function requestBody(conversation) {
  const s = state.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of conversation.messages) {
    if (m !== state.live && (m.role === "user" || m.content)) messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, temperature: s.temperature, top_p: s.top_p, max_tokens: Math.round(s.max_tokens) };
  if (s.model) body.model = s.model;
  return body;
}

async function generate(conversation) {
  const message = { role: "assistant", content: "", model: state.settings.model };
  conversation.messages.push(message);
  conversation.updated = Date.now();
  state.live = message;
  state.controller = new AbortController();
  setBusy(true);
  renderMessages();
  save();
  try {
    await streamChat(requestBody(conversation), state.controller.signal, (delta) => {
      message.content += delta.content;
      if (delta.reasoning) message.reasoning = (message.reasoning || "") + delta.reasoning;
      renderLive();
    });
  } catch (e) {
    if (e.name === "AbortError") message.stopped = true;
    else message.error = String(e.message || e);
  } finally {
    state.live = null;
    state.controller = null;
    setBusy(false);
    save();
    if (conversation.id === state.currentId) renderMessages();
    $("message").focus();
  }
}

function send() {
  const box = $("message");
  const text = box.value;
  if (state.controller || !text.trim()) return;
  const conversation = current();
  conversation.messages.push({ role: "user", content: text });
  conversation.title = store.titleOf(conversation);
  box.value = "";
  generate(conversation);
}

function stop() {
  if (state.controller) state.controller.abort();
}

function regenerate() {
  const conversation = current();
  if (state.controller) return;
  if (conversation.messages.at(-1)?.role === "assistant") conversation.messages.pop();
  generate(conversation);
}

function resendEdited(index, text) {
  if (state.controller || !text.trim()) return;
  const conversation = current();
  conversation.messages = conversation.messages.slice(0, index);
  conversation.messages.push({ role: "user", content: text });
  conversation.title = store.titleOf(conversation);
  state.editing = -1;
  generate(conversation);
}

// ---- conversations ----------------------------------------------------------------------------------

function openConversation(id) {
  if (state.controller) stop(); // its reply stops where it is; the other conversation opens
  state.currentId = id;
  state.editing = -1;
  renderMessages(); // first: it makes the new conversation the list then shows
  renderList();
  $("message").focus();
}

function newChat() {
  state.conversations = state.conversations.filter((c) => c.messages.length); // one empty chat at most
  openConversation(null);
}

function deleteConversation(id) {
  if (state.controller && id === state.currentId) stop();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (id === state.currentId) state.currentId = state.conversations[0]?.id ?? null;
  save();
  renderMessages();
}

function exportAll() {
  const kept = state.conversations.filter((c) => c.messages.length);
  const blob = new Blob([store.exportJson(kept)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  a.download = "edgellm-chats.json";
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

async function importFile(file) {
  try {
    const imported = store.parseImport(await file.text(), state.conversations);
    if (!imported.length) throw new Error("no conversations in it");
    state.conversations.push(...imported);
    save();
    openConversation(imported[0].id);
    setStatus(`Imported ${imported.length} conversation${imported.length > 1 ? "s" : ""}`);
  } catch (e) {
    setStatus(`Import failed: ${e.message}`);
  }
}

// ---- settings, models, key, theme -----------------------------------------------------------------

function theme() {
  return state.settings.theme || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
}

function applyTheme() {
  document.documentElement.dataset.theme = theme();
}

function toggleTheme() {
  state.settings.theme = theme() === "dark" ? "light" : "dark";
  store.saveSettings(state.settings);
  applyTheme();
}

function bindSettings() {
  const fields = { "system-prompt": "system", temperature: "temperature", "top-p": "top_p", "max-tokens": "max_tokens" };
  for (const [id, key] of Object.entries(fields)) {
    $(id).value = state.settings[key];
    $(id).addEventListener("change", () => {
      state.settings[key] = key === "system" ? $(id).value : numberOr(id, store.DEFAULT_SETTINGS[key]);
      store.saveSettings(state.settings);
    });
  }
}

async function loadModels() {
  setStatus("Connecting…");
  try {
    const models = await listModels();
    const select = $("model");
    select.replaceChildren(...models.map((id) => Object.assign(el("option", null, id.split("/").pop()), { value: id, title: id })));
    if (!models.includes(state.settings.model)) state.settings.model = models[0] || "";
    select.value = state.settings.model;
    setStatus("");
  } catch (e) {
    setStatus(String(e.message || e));
  }
}

function askForKey(reason) {
  const dialog = $("key-dialog");
  $("key-reason").textContent = reason;
  if (!dialog.open) dialog.showModal();
  $("api-key").focus();
  return new Promise((resolve) => {
    $("key-form").addEventListener("submit", function submitted(e) {
      e.preventDefault();
      const key = $("api-key").value.trim();
      if (!key) return;
      $("key-form").removeEventListener("submit", submitted);
      store.saveKey(key);
      $("api-key").value = "";
      dialog.close();
      resolve();
    });
  });
}

function bindEvents() {
  $("composer").addEventListener("submit", (e) => (e.preventDefault(), send()));
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.controller) {
      e.preventDefault();
      stop();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  $("export").addEventListener("click", exportAll);
  $("import").addEventListener("click", () => $("import-file").click());
  $("import-file").addEventListener("change", (e) => {
    if (e.target.files[0]) importFile(e.target.files[0]);
    e.target.value = "";
  });
  $("theme").addEventListener("click", toggleTheme);
  $("model").addEventListener("change", () => {
    state.settings.model = $("model").value;
    store.saveSettings(state.settings);
  });
}

onKeyNeeded(askForKey);
$("key-dialog").addEventListener("cancel", (e) => e.preventDefault()); // Esc: no key, no page; keep asking
applyTheme();
bindSettings();
bindEvents();
state.currentId = state.conversations.sort((a, b) => b.updated - a.updated)[0]?.id ?? null;
renderMessages(); // first: it makes the conversation the list shows when there is none yet
renderList();
// A server with --api-key says so in the page: ask before the first call rather than after its 401.
const keyMeta = document.querySelector('meta[name="edgellm-api-key"]');
const keyFirst = keyMeta && keyMeta.content === "required" && !store.loadKey() ? askForKey("") : null;
Promise.resolve(keyFirst).then(loadModels);
$("message").focus();
