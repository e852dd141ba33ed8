// localrun's chat page: talks to this server's /v1 (OpenAI's chat completions, streamed), keeps its conversations
// in this browser (localStorage). No build step, no library, nothing fetched from elsewhere: the server's
// Content-Security-Policy allows this page to reach its own origin only.
"use strict";

const STORE = "localrun.chat.";
const $ = (id) => document.getElementById(id);

const state = {
  conversations: load("conversations", []),  // [{id, title, model, updated, messages: [{role, content, thinking, images, meta}]}]
  current: load("current", null),
  controller: null,  // the answer being streamed: its AbortController
};

function load(name, fallback) {
  try {
    const raw = localStorage.getItem(STORE + name);
    return raw === null ? fallback : JSON.parse(raw);
  } catch (e) {
    return fallback;
  }
}

function save(name, value) {
  try {
    localStorage.setItem(STORE + name, JSON.stringify(value));
    return true;
  } catch (e) {  // the browser's quota (images take room): kept for this page only
    return false;
  }
}

function saveConversations() {
  if (save("conversations", state.conversations)) return;
  // Over the quota: the images of older messages are left out of what is kept (they stay on the page).
  const lighter = state.conversations.map((c) => ({...c, messages: c.messages.map((m) => (m.images ? {...m, images: [], imagesDropped: m.images.length} : m))}));
  if (!save("conversations", lighter)) notify("this browser's storage is full: delete a conversation to keep new ones", true);
}

function notify(text, error) {
  const el = $("notice");
  el.textContent = text || "";
  el.hidden = !text;
  el.classList.toggle("error", Boolean(error));
}

// -- the server ------------------------------------------------------------------------------------------------

function headers() {
  const key = $("api-key").value.trim();
  return {"Content-Type": "application/json", ...(key ? {"Authorization": "Bearer " + key} : {})};
}

async function failure(response) {
  let message = "HTTP " + response.status;
  try {
    const body = await response.json();
    const error = body.error;
    message = (error && (error.message || error)) || body.message || message;
  } catch (e) { /* not JSON */ }
  if (response.status === 401) {
    $("settings").open = true;
    $("api-key").focus();
    message += " (set the server's API key in Settings)";
  }
  return typeof message === "string" ? message : JSON.stringify(message);
}

async function loadModels() {
  const select = $("model");
  let listed;
  try {
    const response = await fetch("/v1/models", {headers: headers()});
    if (!response.ok) {
      notify("cannot list the models: " + await failure(response), true);
      return;
    }
    listed = (await response.json()).data || [];
  } catch (e) {
    notify("cannot reach the server: " + e.message, true);
    return;
  }
  const wanted = select.value || load("model", "");
  select.textContent = "";
  for (const m of listed) {
    const option = document.createElement("option");
    option.value = m.id;
    option.textContent = m.id + (m.meta && m.meta.loaded ? "  (loaded)" : "");
    select.append(option);
  }
  if (!listed.length) {
    notify("no models yet: pull one with `localrun pull MODEL`, then reload", true);
    return;
  }
  notify("");
  const conversation = currentConversation();
  const pick = (conversation && conversation.model) || wanted;
  if (listed.some((m) => m.id === pick)) select.value = pick;
}

// -- conversations -------------------------------------------------------------------------------------------

function currentConversation() {
  return state.conversations.find((c) => c.id === state.current) || null;
}

function newConversation() {
  const conversation = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: "New chat", model: $("model").value,
                        updated: Date.now(), messages: []};
  state.conversations.unshift(conversation);
  state.current = conversation.id;
  save("current", state.current);
  return conversation;
}

function selectConversation(id) {
  if (state.controller) return;
  state.current = id;
  save("current", id);
  const conversation = currentConversation();
  if (conversation && conversation.model && [...$("model").options].some((o) => o.value === conversation.model)) $("model").value = conversation.model;
  render();
}

function deleteConversation(id) {
  if (state.controller && id === state.current) return;
  state.conversations = state.conversations.filter((c) => c.id !== id);
  if (state.current === id) state.current = state.conversations.length ? state.conversations[0].id : null;
  save("current", state.current);
  saveConversations();
  render();
}

function renderList() {
  const list = $("conversations");
  list.textContent = "";
  for (const c of state.conversations) {
    const item = document.createElement("li");
    item.className = c.id === state.current ? "current" : "";
    item.dataset.id = c.id;
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = c.title;
    const remove = document.createElement("button");
    remove.className = "delete";
    remove.type = "button";
    remove.title = "Delete this conversation";
    remove.textContent = "\u00d7";
    remove.addEventListener("click", (event) => { event.stopPropagation(); deleteConversation(c.id); });
    item.append(title, remove);
    item.addEventListener("click", () => selectConversation(c.id));
    list.append(item);
  }
}

// -- the messages --------------------------------------------------------------------------------------------

function render() {
  renderList();
  const box = $("messages");
  box.textContent = "";
  const conversation = currentConversation();
  if (!conversation) return;
  conversation.messages.forEach((m, i) => box.append(messageElement(m, i === conversation.messages.length - 1)));
  box.scrollTop = box.scrollHeight;
}

function messageElement(m, last) {
  const el = document.createElement("div");
  el.className = "message " + m.role + (m.error ? " error" : "");
  el.dataset.role = m.role;
  el.dataset.state = m.state || "done";
  if (m.images && m.images.length) {
    const images = document.createElement("div");
    images.className = "images";
    for (const url of m.images) {
      const img = document.createElement("img");
      img.src = url;
      img.alt = "an attached image";
      images.append(img);
    }
    el.append(images);
  }
  if (m.role === "user") {
    const bubble = document.createElement("div");
    bubble.className = "bubble";
    bubble.textContent = m.content;
    el.append(bubble);
    return el;
  }
  const thinking = document.createElement("details");
  thinking.className = "thinking";
  thinking.innerHTML = "<summary></summary><div class=\"thinking-body\"></div>";
  const content = document.createElement("div");
  content.className = "content";
  const meta = document.createElement("div");
  meta.className = "meta";
  el.append(thinking, content, meta);
  fillAssistant(el, m, last);
  return el;
}

function fillAssistant(el, m, last) {
  const [thinking, content, meta] = [el.querySelector(".thinking"), el.querySelector(".content"), el.querySelector(".meta")];
  el.dataset.state = m.state || "done";
  el.classList.toggle("error", Boolean(m.error));
  thinking.hidden = !m.thinking;
  if (m.thinking) {
    thinking.querySelector("summary").textContent = m.state === "streaming" && !m.content ? "Thinking\u2026" : "Thought" + (m.thoughtFor ? " for " + m.thoughtFor.toFixed(1) + " s" : "");
    thinking.querySelector(".thinking-body").textContent = m.thinking;
  }
  if (m.error) {
    content.textContent = m.error;
  } else if (m.state === "streaming" && !m.content && !m.thinking) {
    content.innerHTML = "";
    const waiting = document.createElement("p");
    waiting.className = "progress";
    waiting.textContent = m.progress || "Waiting for the model\u2026";
    content.append(waiting);
  } else {
    content.innerHTML = markdown(m.content || "");
    for (const button of content.querySelectorAll("pre .copy")) button.addEventListener("click", copyCode);
  }
  content.classList.toggle("cursor", m.state === "streaming");
  meta.textContent = "";
  if (m.meta) {
    const figures = document.createElement("span");
    figures.className = "speed";
    figures.textContent = m.meta;
    meta.append(figures);
  }
  if (last && m.state !== "streaming") {
    const again = document.createElement("button");
    again.type = "button";
    again.className = "regenerate";
    again.textContent = "Regenerate";
    again.addEventListener("click", regenerate);
    meta.append(again);
  }
}

function copyCode(event) {
  const code = event.target.closest("pre").querySelector("code").textContent;
  navigator.clipboard.writeText(code).then(() => {
    event.target.textContent = "Copied";
    setTimeout(() => { event.target.textContent = "Copy"; }, 1200);
  }, () => {});
}

// -- markdown (escaped first: nothing the model writes becomes markup but what is below) -------------------------

function escapeHtml(text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

function inline(text) {
  const codes = [];
  let out = escapeHtml(text).replace(/`([^`\n]+)`/g, (_, code) => { codes.push(code); return "\u0000" + (codes.length - 1) + "\u0000"; });
  out = out
    .replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" target="_blank" rel="noopener noreferrer">$1</a>')
    .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
    .replace(/__([^_\n]+)__/g, "<strong>$1</strong>")
    .replace(/(^|[^*\w])\*([^*\s][^*\n]*?)\*(?!\w)/g, "$1<em>$2</em>")
    .replace(/(^|[^_\w])_([^_\s][^_\n]*?)_(?!\w)/g, "$1<em>$2</em>")
    .replace(/~~([^~\n]+)~~/g, "<del>$1</del>");
  return out.replace(/\u0000(\d+)\u0000/g, (_, i) => "<code>" + codes[Number(i)] + "</code>");
}

function markdown(source) {
  const lines = source.replace(/\r\n?/g, "\n").split("\n");
  const out = [];
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) out.push("<p>" + paragraph.map(inline).join("<br>") + "</p>");
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) body.push(lines[i]);
      out.push('<pre><div class="code-head"><span>' + escapeHtml(fence[2] || "code") + '</span><button type="button" class="copy">Copy</button></div><code>'
               + escapeHtml(body.join("\n")) + "</code></pre>");
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) { flush(); out.push(`<h${heading[1].length}>${inline(heading[2])}</h${heading[1].length}>`); continue; }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); out.push("<hr>"); continue; }
    if (/^\s*>/.test(line)) {
      flush();
      const quoted = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i++) quoted.push(lines[i].replace(/^\s*>\s?/, ""));
      i--;
      out.push("<blockquote>" + markdown(quoted.join("\n")) + "</blockquote>");
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const items = [];
      for (; i < lines.length; i++) {
        const next = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (next && /\d/.test(next[1]) === ordered) items.push(next[2]);
        else if (items.length && /^\s{2,}\S/.test(lines[i])) items[items.length - 1] += "\n" + lines[i].trim();
        else break;
      }
      i--;
      const tag = ordered ? "ol" : "ul";
      out.push(`<${tag}>` + items.map((t) => "<li>" + t.split("\n").map(inline).join("<br>") + "</li>").join("") + `</${tag}>`);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/.test(lines[i + 1])) {
      flush();
      const cells = (row) => row.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => inline(c.trim()));
      const head = cells(line);
      const rows = [];
      for (i += 2; i < lines.length && lines[i].includes("|"); i++) rows.push(cells(lines[i]));
      i--;
      out.push("<table><thead><tr>" + head.map((c) => "<th>" + c + "</th>").join("") + "</tr></thead><tbody>"
               + rows.map((r) => "<tr>" + r.map((c) => "<td>" + c + "</td>").join("") + "</tr>").join("") + "</tbody></table>");
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    paragraph.push(line);
  }
  flush();
  return out.join("");
}

// -- asking ----------------------------------------------------------------------------------------------------

function wireMessages(conversation) {
  const system = $("system").value.trim();
  const messages = system ? [{role: "system", content: system}] : [];
  for (const m of conversation.messages) {
    if (m.role === "user") {
      const images = m.images || [];
      messages.push({role: "user", content: images.length
        ? [...images.map((url) => ({type: "image_url", image_url: {url}})), {type: "text", text: m.content}]
        : m.content});
    } else if (!m.error && m.content) {
      messages.push({role: "assistant", content: m.content});
    }
  }
  return messages;
}

function requestBody(conversation) {
  const body = {model: $("model").value, messages: wireMessages(conversation), stream: true,
                stream_options: {include_usage: true}, return_progress: true};
  const temperature = $("temperature").value.trim();
  const maxTokens = $("max-tokens").value.trim();
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  return body;
}

async function ask(conversation) {
  const answer = {role: "assistant", content: "", thinking: "", state: "streaming"};
  conversation.messages.push(answer);
  conversation.model = $("model").value;
  render();
  const el = $("messages").lastElementChild;
  const controller = new AbortController();
  state.controller = controller;
  busy(true);
  const clock = {started: performance.now(), first: null, thinkingFrom: null, thinkingTo: null, tokens: 0};
  let drawn = 0;
  const draw = () => {
    if (drawn) return;
    drawn = requestAnimationFrame(() => {
      drawn = 0;
      fillAssistant(el, answer, true);
      const box = $("messages");
      if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
    });
  };
  try {
    const response = await fetch("/v1/chat/completions", {method: "POST", headers: headers(), body: JSON.stringify(requestBody(conversation)),
                                                          signal: controller.signal});
    if (!response.ok) {
      answer.error = await failure(response);
    } else {
      await readStream(response, (event) => take(event, answer, clock, draw));
    }
    answer.state = answer.error ? "error" : "done";
  } catch (e) {
    if (e.name === "AbortError") {
      answer.state = "stopped";
      answer.meta = "stopped";
    } else {
      answer.state = "error";
      answer.error = "the answer failed: " + e.message;
    }
  } finally {
    if (drawn) cancelAnimationFrame(drawn);
    state.controller = null;
    busy(false);
    delete answer.progress;
    if (clock.thinkingFrom !== null) answer.thoughtFor = ((clock.thinkingTo || performance.now()) - clock.thinkingFrom) / 1000;
    conversation.updated = Date.now();
    saveConversations();
    render();
  }
}

async function readStream(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data || data === "[DONE]") continue;  // (": keep-alive" comments carry no data)
      onEvent(JSON.parse(data));
    }
  }
}

function take(event, answer, clock, draw) {
  if (event.error) {
    answer.error = "the server stopped the answer: " + (event.error.message || JSON.stringify(event.error));
    draw();
    return;
  }
  if (event.prompt_progress) {
    const p = event.prompt_progress;
    answer.progress = `Reading the prompt: ${p.processed.toLocaleString()} of ${p.total.toLocaleString()} tokens`
                      + (p.cache ? ` (${p.cache.toLocaleString()} from the cache)` : "");
  }
  const delta = (event.choices && event.choices[0] && event.choices[0].delta) || {};
  const now = performance.now();
  if (delta.reasoning_content) {
    if (clock.thinkingFrom === null) clock.thinkingFrom = now;
    answer.thinking += delta.reasoning_content;
  }
  if (delta.content) {
    if (clock.first === null) clock.first = now;
    if (clock.thinkingFrom !== null && clock.thinkingTo === null) clock.thinkingTo = now;
    answer.content += delta.content;
    clock.tokens++;
  }
  if (event.usage) answer.meta = speed(event.usage, event.timings, clock);
  draw();
}

function speed(usage, timings, clock) {
  const tokens = usage.completion_tokens;
  const parts = [tokens + " tokens"];
  const perToken = timings && timings.tpot_s;
  const rate = perToken > 0 ? 1 / perToken
    : clock.first !== null && tokens > 1 ? (tokens - 1) / ((performance.now() - clock.first) / 1000) : null;
  if (rate) parts.push(rate.toFixed(1) + " tokens/s");
  if (timings && timings.ttft_s) parts.push("first token " + timings.ttft_s.toFixed(2) + " s");
  const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
  parts.push("prompt " + usage.prompt_tokens + (cached ? " (" + cached + " cached)" : ""));
  return parts.join(" \u00b7 ");
}

function busy(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("model").disabled = on;
  $("new-chat").disabled = on;
}

// -- the composer ----------------------------------------------------------------------------------------------

const attached = [];  // data URLs of the images for the next message

function attach(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    const reader = new FileReader();
    reader.onload = () => { attached.push(reader.result); renderAttachments(); };
    reader.readAsDataURL(file);
  }
}

function renderAttachments() {
  const box = $("attachments");
  box.textContent = "";
  attached.forEach((url, i) => {
    const item = document.createElement("div");
    item.className = "attachment";
    const img = document.createElement("img");
    img.src = url;
    img.alt = "image to send";
    const remove = document.createElement("button");
    remove.type = "button";
    remove.title = "Remove";
    remove.textContent = "\u00d7";
    remove.addEventListener("click", () => { attached.splice(i, 1); renderAttachments(); });
    item.append(img, remove);
    box.append(item);
  });
}

function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (state.controller || (!text && !attached.length)) return;
  if (!$("model").value) {
    notify("pick a model first", true);
    return;
  }
  const conversation = currentConversation() || newConversation();
  const message = {role: "user", content: text};
  if (attached.length) message.images = attached.splice(0);
  conversation.messages.push(message);
  if (conversation.title === "New chat") conversation.title = (text || "an image").slice(0, 48);
  $("prompt").value = "";
  grow();
  renderAttachments();
  ask(conversation);
}

function regenerate() {
  const conversation = currentConversation();
  if (!conversation || state.controller) return;
  while (conversation.messages.length && conversation.messages[conversation.messages.length - 1].role === "assistant") conversation.messages.pop();
  if (conversation.messages.length) ask(conversation);
}

function grow() {
  const prompt = $("prompt");
  prompt.style.height = "auto";
  prompt.style.height = prompt.scrollHeight + "px";
}

function start() {
  $("api-key").value = load("key", "");
  $("system").value = load("system", "");
  $("temperature").value = load("temperature", "");
  $("max-tokens").value = load("maxTokens", "");
  $("api-key").addEventListener("change", () => { save("key", $("api-key").value.trim()); loadModels(); });
  $("system").addEventListener("change", () => save("system", $("system").value));
  $("temperature").addEventListener("change", () => save("temperature", $("temperature").value));
  $("max-tokens").addEventListener("change", () => save("maxTokens", $("max-tokens").value));
  $("model").addEventListener("change", () => save("model", $("model").value));
  $("reload-models").addEventListener("click", loadModels);
  $("new-chat").addEventListener("click", () => { newConversation(); saveConversations(); render(); $("prompt").focus(); });
  $("composer").addEventListener("submit", send);
  $("settings-form").addEventListener("submit", (event) => { event.preventDefault(); $("settings").open = false; });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("prompt").addEventListener("input", grow);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) send(event);
  });
  $("image-input").addEventListener("change", (event) => { attach(event.target.files); event.target.value = ""; });
  $("prompt").addEventListener("paste", (event) => attach([...event.clipboardData.files]));
  const composer = $("composer");
  composer.addEventListener("dragover", (event) => { event.preventDefault(); composer.classList.add("dragging"); });
  composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
  composer.addEventListener("drop", (event) => { event.preventDefault(); composer.classList.remove("dragging"); attach(event.dataTransfer.files); });
  render();
  loadModels();
  $("prompt").focus();
}

start();
