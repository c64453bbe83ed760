// app.js — the chat page: conversations kept in this browser (localStorage), streaming answers
// from the server's own POST /v1/chat/completions (SSE, stream_options.include_usage for the
// token counts, the KV store's cached tokens and the server's timings), a stop button that
// aborts the fetch (the server cancels the generation when the connection closes), settings,
// and the API key when the server asks for one. Model text reaches the page only through
// markdown.js, which never parses it as HTML.
"use strict";
(function () {
  const K_CONVS = "larder.conversations.v1", K_CURRENT = "larder.current.v1";
  const K_SETTINGS = "larder.settings.v1", K_KEY = "larder.apiKey";
  const $ = (id) => document.getElementById(id);

  function load(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v === null ? fallback : v;
    } catch (e) {
      return fallback;
    }
  }
  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      showStatus("could not save to this browser's storage: " + e.message);
    }
  }

  let convs = load(K_CONVS, []);
  if (!Array.isArray(convs)) convs = [];
  let currentId = load(K_CURRENT, null);
  const settings = Object.assign({ system: "", temperature: "", top_p: "", max_tokens: "", seed: "", extra: "" },
                                 load(K_SETTINGS, {}));
  let modelId = null;
  let controller = null;  // the running generation's AbortController
  let live = null;        // {msg, body, stats}: the answer being streamed and its elements

  const saveConvs = () => { store(K_CONVS, convs); store(K_CURRENT, currentId); };
  const current = () => convs.find((c) => c.id === currentId) || null;
  const apiKey = () => localStorage.getItem(K_KEY) || "";

  function showStatus(text) { $("status").textContent = text || ""; }

  function headers() {
    const h = { "Content-Type": "application/json" };
    if (apiKey()) h["Authorization"] = "Bearer " + apiKey();
    return h;
  }

  // -- conversations list (on a narrow window: a panel over the chat)
  function closeSidebar() {
    if (!$("sidebar").classList.contains("open")) return;
    $("sidebar").classList.remove("open");
    $("toggle-sidebar").setAttribute("aria-expanded", "false");
    $("toggle-sidebar").focus();
  }

  function newConversation() {
    const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: "", created: Date.now(), messages: [] };
    convs.unshift(c);
    currentId = c.id;
    saveConvs();
    return c;
  }

  function renderList() {
    const ul = $("conversations");
    ul.textContent = "";
    for (const c of convs) {
      const li = document.createElement("li");
      li.dataset.id = c.id;
      if (c.id === currentId) li.setAttribute("aria-current", "true");
      const open = document.createElement("button");
      open.type = "button";
      open.className = "open";
      open.textContent = c.title || "New chat";
      open.title = c.title || "New chat";
      open.addEventListener("click", () => {
        if (controller) return;
        currentId = c.id;
        saveConvs();
        renderAll();
        closeSidebar();
      });
      const del = document.createElement("button");
      del.type = "button";
      del.className = "delete";
      del.textContent = "\u00d7";
      del.setAttribute("aria-label", "Delete conversation " + (c.title || "New chat"));
      del.addEventListener("click", () => {
        if (controller && c.id === currentId) return;
        convs = convs.filter((x) => x.id !== c.id);
        if (currentId === c.id) currentId = convs.length ? convs[0].id : null;
        saveConvs();
        renderAll();
      });
      li.append(open, del);
      ul.appendChild(li);
    }
  }

  // -- messages
  function statsText(m) {
    const s = m.stats || {};
    const parts = [];
    if (m.state === "stopped") parts.push("stopped");
    if (s.completion_tokens !== undefined) parts.push(s.completion_tokens + " tokens");
    if (s.tps) parts.push(s.tps.toFixed(1) + " tok/s");
    if (s.ttft_ms !== undefined) parts.push("TTFT " + Math.round(s.ttft_ms) + " ms");
    if (s.prompt_tokens !== undefined) {
      let p = "prompt " + s.prompt_tokens + " tokens, " + (s.cached_tokens || 0) + " cached";
      if (s.cache_tier) p += " (" + s.cache_tier + ")";
      parts.push(p);
    }
    return parts.join(" · ");
  }

  function renderMessage(m) {
    const div = document.createElement("div");
    div.className = "msg " + (m.role === "user" ? "user" : "assistant");
    div.dataset.state = m.state || "done";
    if (m.state === "streaming") div.setAttribute("aria-busy", "true");  // screen readers: read it once, when done
    const role = document.createElement("div");
    role.className = "role";
    role.textContent = m.role === "user" ? "You" : modelId || "assistant";
    const body = document.createElement("div");
    body.className = "body";
    const stats = document.createElement("div");
    stats.className = "stats";
    div.append(role, body, stats);
    fillMessage(m, body, stats);
    return { div, body, stats };
  }

  function isLastAnswer(m) {
    const c = current();
    return !!c && c.messages[c.messages.length - 1] === m;
  }

  function fillMessage(m, body, stats) {
    body.textContent = "";
    const oldActions = body.parentElement && body.parentElement.querySelector(".actions");
    if (oldActions) oldActions.remove();
    if (m.role === "user") {
      body.textContent = m.content;  // what the user typed, verbatim
    } else {
      if (m.reasoning) {
        const d = document.createElement("details");
        const sum = document.createElement("summary");
        sum.textContent = "Reasoning";
        const pre = document.createElement("div");
        pre.className = "reasoning";
        pre.textContent = m.reasoning;
        d.append(sum, pre);
        body.appendChild(d);
      }
      body.appendChild(window.larderMarkdown.render(m.content || ""));
      if (m.state !== "streaming") addCopyButtons(body);
      if (m.state !== "streaming" && isLastAnswer(m)) {
        const row = document.createElement("div");
        row.className = "actions";
        const again = document.createElement("button");
        again.type = "button";
        again.className = "regenerate";
        again.textContent = "Regenerate";
        again.addEventListener("click", regenerate);
        row.appendChild(again);
        body.after(row);
      }
      if (m.error) {
        const e = document.createElement("p");
        e.className = "error";
        e.textContent = "Error: " + m.error;
        body.appendChild(e);
      }
    }
    const s = m.stats || {};
    stats.textContent = m.role === "user" ? "" : statsText(m);
    for (const k of ["completion_tokens", "prompt_tokens", "cached_tokens", "ttft_ms", "tps"]) {
      if (s[k] !== undefined) stats.dataset[k.replace(/_(\w)/g, (x, c) => c.toUpperCase())] = String(s[k]);
    }
  }

  function addCopyButtons(body) {
    for (const pre of body.querySelectorAll("pre")) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "copy";
      b.textContent = "Copy";
      b.setAttribute("aria-label", "Copy code");
      b.addEventListener("click", () => {
        const text = pre.querySelector("code").textContent;
        navigator.clipboard.writeText(text).then(() => { b.textContent = "Copied"; },
                                                  () => { b.textContent = "Copy failed"; });
        setTimeout(() => { b.textContent = "Copy"; }, 1500);
      });
      pre.prepend(b);
    }
  }

  function renderMessages() {
    const box = $("messages");
    box.textContent = "";
    const c = current();
    if (!c) return;
    for (const m of c.messages) box.appendChild(renderMessage(m).div);
    box.scrollTop = box.scrollHeight;
  }

  function renderAll() {
    renderList();
    renderMessages();
  }

  // -- settings
  const FIELDS = [["system-prompt", "system"], ["temperature", "temperature"], ["top-p", "top_p"],
                  ["max-tokens", "max_tokens"], ["seed", "seed"], ["extra-json", "extra"]];
  function bindSettings() {
    for (const [id, key] of FIELDS) {
      const input = $(id);
      input.value = settings[key];
      input.addEventListener("input", () => {
        settings[key] = input.value;
        store(K_SETTINGS, settings);
        $("settings-error").textContent = "";
      });
    }
  }

  // The request body: the conversation so far (with the system prompt first) and the settings;
  // throws with a message naming the bad setting.
  function requestBody(conv) {
    const messages = [];
    if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
    for (const m of conv.messages) {
      if (m.role === "assistant" && (m.state === "streaming" || (m.error && !m.content))) continue;
      messages.push({ role: m.role, content: m.content });
    }
    const body = { messages, stream: true, stream_options: { include_usage: true } };
    const num = (key, name, integer) => {
      const v = String(settings[key]).trim();
      if (v === "") return;
      const n = Number(v);
      if (!Number.isFinite(n) || (integer && !Number.isInteger(n))) throw new Error(name + " must be a number" + (integer ? " (integer)" : ""));
      body[key] = n;
    };
    num("temperature", "temperature", false);
    num("top_p", "top_p", false);
    num("max_tokens", "max tokens", true);
    num("seed", "seed", true);
    if (settings.extra.trim()) {
      let extra;
      try {
        extra = JSON.parse(settings.extra);
      } catch (e) {
        throw new Error("extra request fields are not valid JSON: " + e.message);
      }
      if (!extra || typeof extra !== "object" || Array.isArray(extra)) throw new Error("extra request fields must be a JSON object");
      for (const k of Object.keys(extra)) if (k !== "messages" && k !== "stream") body[k] = extra[k];
    }
    return body;
  }

  // -- streaming
  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    $("new-chat").disabled = busy;
  }

  let frameQueued = false;
  function scheduleRender() {
    if (frameQueued || !live) return;
    frameQueued = true;
    requestAnimationFrame(() => {
      frameQueued = false;
      if (!live) return;
      fillMessage(live.msg, live.body, live.stats);
      const box = $("messages");
      if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
    });
  }

  function settingsError(e) {
    $("settings").hidden = false;
    $("toggle-settings").setAttribute("aria-expanded", "true");
    $("settings-error").textContent = e.message;
  }

  async function send(text) {
    const conv = current() || newConversation();
    conv.messages.push({ role: "user", content: text });
    let body;
    try {
      body = requestBody(conv);
    } catch (e) {
      conv.messages.pop();
      settingsError(e);
      return false;
    }
    if (!conv.title) conv.title = text.replace(/\s+/g, " ").slice(0, 60);
    return ask(conv, body);
  }

  // Regenerate: the last answer is replaced by a new one to the same conversation (its whole
  // prompt is then in the KV store: the cached tokens show it).
  function regenerate() {
    const conv = current();
    if (controller || !conv || !conv.messages.length || conv.messages[conv.messages.length - 1].role !== "assistant") return;
    const old = conv.messages.pop();
    let body;
    try {
      body = requestBody(conv);
    } catch (e) {
      conv.messages.push(old);
      settingsError(e);
      return;
    }
    ask(conv, body);
  }

  async function ask(conv, body) {
    const answer = { role: "assistant", content: "", state: "streaming", stats: {} };
    conv.messages.push(answer);
    saveConvs();
    renderAll();
    const box = $("messages");
    const node = box.lastElementChild;
    live = { msg: answer, body: node.querySelector(".body"), stats: node.querySelector(".stats") };
    showStatus("");
    setBusy(true);
    controller = new AbortController();
    const t0 = performance.now();
    let tFirst = null, chunks = 0, usage = null;
    try {
      const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal });
      if (!r.ok) {
        let msg = "HTTP " + r.status;
        try {
          const j = await r.json();
          if (j && j.error && j.error.message) msg = j.error.message;
        } catch (e) { /* not JSON */ }
        if (r.status === 401) showKeyPanel(msg);
        throw new Error(msg);
      }
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          for (const line of frame.split("\n")) {
            if (!line.startsWith("data:")) continue;  // ": keep-alive" comments, event names
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const j = JSON.parse(data);
            if (j.error) throw new Error(j.error.message || "generation failed");
            if (j.usage) usage = j.usage;
            const ch = j.choices && j.choices[0];
            const delta = ch && ch.delta;
            if (!delta) continue;
            if (delta.content) {
              if (tFirst === null) tFirst = performance.now();
              answer.content += delta.content;
              chunks++;
            }
            if (delta.reasoning_content) {
              if (tFirst === null) tFirst = performance.now();
              answer.reasoning = (answer.reasoning || "") + delta.reasoning_content;
              chunks++;
            }
            scheduleRender();
          }
        }
      }
      answer.state = "done";
    } catch (e) {
      if (e.name === "AbortError") {
        answer.state = "stopped";
      } else {
        answer.state = "error";
        answer.error = e.message;
        showStatus(e.message);
      }
    }
    const tEnd = performance.now();
    const s = answer.stats;
    if (tFirst !== null) s.ttft_ms = tFirst - t0;
    if (usage) {
      const lx = usage.larder || {}, tm = lx.timings || {};
      s.prompt_tokens = usage.prompt_tokens;
      s.completion_tokens = usage.completion_tokens;
      s.cached_tokens = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
      if (lx.cache && lx.cache.tier) s.cache_tier = lx.cache.tier;
      if (tm.ttft_ms !== undefined) s.ttft_ms = tm.ttft_ms;  // the server's own measure, without the network
      if (tm.decode_tps) s.tps = tm.decode_tps;
    } else if (chunks) {
      s.completion_tokens = chunks;  // one chunk per token (an estimate: no usage after a stop)
    }
    if (!s.tps && tFirst !== null && s.completion_tokens > 1 && tEnd > tFirst) s.tps = (s.completion_tokens - 1) / ((tEnd - tFirst) / 1000);
    controller = null;
    const done = live;
    live = null;
    fillMessage(answer, done.body, done.stats);
    done.body.parentElement.dataset.state = answer.state;
    done.body.parentElement.removeAttribute("aria-busy");
    setBusy(false);
    saveConvs();
    if (answer.state === "done" || answer.state === "stopped") {
      renderMessages();  // moves Regenerate to this answer
      showKv();
    }
    return true;
  }

  // -- the KV store, as /stats reports it
  function mib(n) { return (n / 1048576).toFixed(1) + " MiB"; }
  async function showKv() {
    try {
      const r = await fetch("/stats", { headers: headers() });
      if (!r.ok) return;
      const kv = (await r.json()).kv_store;
      if (!kv || !kv.ram) return;
      let t = "KV store: " + kv.ram.entries + " in RAM (" + mib(kv.ram.bytes) + ")";
      if (kv.ssd && kv.ssd.enabled) t += ", " + kv.ssd.entries + " on SSD (" + mib(kv.ssd.bytes) + ")";
      const reused = kv.reused_tokens ? (kv.reused_tokens.ram || 0) + (kv.reused_tokens.ssd || 0) : 0;
      t += ", " + reused + " tokens reused";
      $("kv").textContent = t;
    } catch (e) { /* the line is a nicety: leave it as it was */ }
  }

  // -- API key
  function showKeyPanel(reason) {
    $("key-panel").hidden = false;
    if (reason) showStatus(reason);
    $("api-key").focus();
  }

  async function loadModel() {
    try {
      const r = await fetch("/v1/models", { headers: headers() });
      if (r.status === 401) {
        showKeyPanel(apiKey() ? "The API key was not accepted." : "This server needs an API key.");
        return;
      }
      if (r.status === 503) {  // the model is still loading: ask again shortly
        showStatus("The model is loading…");
        setTimeout(loadModel, 1000);
        return;
      }
      if (!r.ok) {
        showStatus("GET /v1/models answered " + r.status);
        return;
      }
      const j = await r.json();
      modelId = j.data && j.data[0] && j.data[0].id;
      if (modelId) {
        $("model-name").textContent = modelId;
        document.title = modelId + " — larder chat";
      }
      $("key-panel").hidden = true;
      showStatus("");
      renderMessages();
      showKv();
    } catch (e) {
      showStatus("the server did not answer: " + e.message);
    }
  }

  // -- wiring
  function init() {
    bindSettings();
    renderAll();
    $("composer").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const input = $("input");
      const text = input.value;
      if (controller || !text.trim()) return;
      input.value = "";
      send(text).then((sent) => { if (!sent) input.value = text; });
    });
    $("input").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
    document.addEventListener("keydown", (ev) => {  // Escape stops an answer from anywhere on the page
      if (ev.key !== "Escape") return;
      if (controller) controller.abort();
      else if ($("sidebar").classList.contains("open")) closeSidebar();
    });
    $("new-chat").addEventListener("click", () => {
      if (controller) return;
      const c = current();
      if (!c || c.messages.length) newConversation();
      renderAll();
      closeSidebar();
      $("input").focus();
    });
    $("toggle-settings").addEventListener("click", () => {
      const s = $("settings");
      s.hidden = !s.hidden;
      $("toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
    });
    $("toggle-sidebar").addEventListener("click", () => {
      const open = $("sidebar").classList.toggle("open");
      $("toggle-sidebar").setAttribute("aria-expanded", String(open));
      if (open) $("close-sidebar").focus();
    });
    $("close-sidebar").addEventListener("click", closeSidebar);
    $("change-key").addEventListener("click", () => showKeyPanel(""));
    $("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      localStorage.setItem(K_KEY, $("api-key").value);
      $("api-key").value = "";
      loadModel();
    });
    // An answer cut short by a reload or a closed tab is kept as stopped, not left streaming.
    let fixed = false;
    for (const c of convs) for (const m of c.messages) if (m.state === "streaming") { m.state = "stopped"; fixed = true; }
    if (fixed) saveConvs();
    // Another tab of this page changed the conversations: show them (not mid-answer, whose
    // save would overwrite them anyway).
    window.addEventListener("storage", (ev) => {
      if (ev.key !== K_CONVS || controller) return;
      const v = load(K_CONVS, []);
      convs = Array.isArray(v) ? v : [];
      if (!current()) currentId = convs.length ? convs[0].id : null;
      renderAll();
    });
    loadModel();
    $("input").focus();
  }

  init();
})();
