// The playground: a chat with one deployment through this panel's /v1 gateway
// (streamed), with each answer's time to first token and tokens per second.
(function () {
  const form = document.getElementById("pg-form");
  if (!form) return;
  const log = document.getElementById("pg-log"), input = document.getElementById("pg-input");
  const send = document.getElementById("pg-send"), stop = document.getElementById("pg-stop");
  let history = [], controller = null;
  // Stop while an answer streams: the request is aborted (the gateway then cancels it
  // at the engine), and what arrived so far stays in the chat.
  stop.addEventListener("click", () => { if (controller) controller.abort(); });

  function bubble(role, text) {
    const el = document.createElement("div");
    el.className = "msg " + role;
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    el.appendChild(body);
    log.appendChild(el);
    log.scrollTop = log.scrollHeight;
    return el;
  }
  function stats(el, text, failed) {
    const s = document.createElement("span");
    s.className = "stats";
    s.textContent = text;
    el.appendChild(s);
    if (failed) el.classList.add("failed");
  }
  document.getElementById("pg-clear").addEventListener("click", () => { history = []; log.replaceChildren(); });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
  });

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    send.disabled = true;
    controller = new AbortController();
    stop.hidden = false; send.hidden = true;
    bubble("user", text);
    history.push({ role: "user", content: text });
    const system = document.getElementById("pg-system").value.trim();
    const messages = (system ? [{ role: "system", content: system }] : []).concat(history);
    const answer = bubble("assistant", "");
    const out = answer.querySelector(".text");
    const body = {
      model: document.getElementById("pg-model").value, messages, stream: true,
      stream_options: { include_usage: true },
      temperature: parseFloat(document.getElementById("pg-temperature").value),
      max_tokens: parseInt(document.getElementById("pg-max-tokens").value, 10),
    };
    const t0 = performance.now();
    let tFirst = null, tLast = null, chunks = 0, usage = null, failure = null, content = "", stopped = false;
    let finish = "";
    try {
      const res = await fetch("/v1/chat/completions", {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": Kiln.csrfToken() },
        body: JSON.stringify(body), signal: controller.signal,
      });
      if (!res.ok) {
        let msg = res.status + " " + res.statusText;
        try { msg = (await res.json()).error.message; } catch (err) { /* not JSON */ }
        throw new Error(msg);
      }
      const reader = res.body.getReader(), decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const event = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (!data || data === "[DONE]") continue;
          const obj = JSON.parse(data);
          if (obj.error) { failure = obj.error.message; continue; }
          if (obj.usage) usage = obj.usage;
          const choice = obj.choices && obj.choices[0];
          if (choice && choice.finish_reason) finish = choice.finish_reason;
          const delta = choice && choice.delta;
          if (delta && delta.content) {
            const now = performance.now();
            if (tFirst === null) tFirst = now;
            tLast = now;
            chunks += 1;
            content += delta.content;
            out.textContent = content;
            log.scrollTop = log.scrollHeight;
          }
        }
      }
    } catch (err) {
      if (err.name === "AbortError") stopped = true;
      else failure = err.message;
    }
    if (content) history.push({ role: "assistant", content });
    else history.pop();
    const tokens = usage ? usage.completion_tokens : chunks;
    const parts = [];
    if (tFirst !== null) {
      parts.push(interpolate(gettext("TTFT %(ms)s ms"), { ms: Math.round(tFirst - t0).toLocaleString() }, true));
      const span = (tLast - tFirst) / 1000;
      parts.push(interpolate(gettext("%(rate)s tok/s"), { rate: tokens > 1 && span > 0 ? ((tokens - 1) / span).toFixed(1) : "–" }, true));
      parts.push(interpolate(ngettext("%(count)s token", "%(count)s tokens", tokens), { count: tokens.toLocaleString() }, true));
    }
    if (stopped) parts.push(gettext("stopped"));
    if (failure) parts.push(interpolate(gettext("error: %(message)s"), { message: failure }, true));
    stats(answer, parts.join(" · "), !!failure);
    answer.dataset.ttftMs = tFirst !== null ? String(Math.round(tFirst - t0)) : "";
    // "stop": the answer ended by itself; "length": cut at max tokens.
    answer.dataset.finishReason = finish;
    send.disabled = false;
    controller = null;
    stop.hidden = true; send.hidden = false;
    input.focus();
  });
})();
