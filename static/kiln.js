// Shared browser helpers: JSON calls with the CSRF token, and the one live
// websocket per tab that pages subscribe to by message type.
window.Kiln = (function () {
  function csrfToken() {
    const m = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return m ? decodeURIComponent(m[1]) : "";
  }
  async function getJSON(url) {
    const res = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    return res.json();
  }
  async function postJSON(url, body) {
    const res = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body || {}),
    });
    let data = {};
    try { data = await res.json(); } catch (e) { /* empty body */ }
    return { status: res.status, body: data };
  }

  const handlers = {};
  let socket = null, retry = 500;
  function connect() {
    const dot = document.getElementById("live-dot");
    socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws/live/");
    socket.onopen = () => { retry = 500; if (dot) dot.classList.add("on"); };
    socket.onmessage = (ev) => {
      const msg = JSON.parse(ev.data);
      (handlers[msg.type] || []).forEach((fn) => fn(msg));
    };
    socket.onclose = (ev) => {
      if (dot) dot.classList.remove("on");
      if (ev.code === 4401) return;  // signed out: reconnecting cannot help
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }
  connect();
  return { getJSON, postJSON, csrfToken, live: { on: (type, fn) => { (handlers[type] = handlers[type] || []).push(fn); } } };
})();
