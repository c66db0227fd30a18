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
  const live = { on: (type, fn) => { (handlers[type] = handlers[type] || []).push(fn); } };

  // Follow a live row the same way on every page: the websocket brings each
  // change as it happens, and a slower poll of the JSON API repairs a tab that
  // missed some (a message sent before this tab's socket connected went to
  // nobody). When the row reaches a final status the page is shown anew, since
  // what a finished row offers (buttons, hashes, results) is rendered by the server.
  //
  //   Kiln.follow({
  //     type: "deployment",            // websocket message type
  //     id: 12,                        // the row; omit it to take every row of the type (a list page)
  //     status: "starting",            // the row's status as the page was rendered
  //     url: "/api/deployments/12",    // backup poll (GET); omit it for none
  //     pick: (data) => data.deployment,  // the row in the poll's answer (on a list page: the array of rows)
  //     interval: 2000,                // ms between polls
  //     isFinal: (status) => ...,      // reaching such a status from another one ends with onFinal
  //     pollWhile: (status) => ...,    // poll only while this holds (default: while not final)
  //     onUpdate: (row) => ...,        // update the page in place, for each message and each polled row
  //     onPoll: (data) => ...,         // optional: the whole poll answer, after its rows (list pages)
  //     onFinal: (row) => ...,         // default: reload the page after reloadDelay ms
  //     reloadDelay: 0,
  //   })
  //
  // Returns {status()}: the status last seen.
  function follow(options) {
    const o = Object.assign({ interval: 5000, pick: (data) => data, isFinal: () => false, reloadDelay: 0,
                              onUpdate: () => {} }, options);
    const pollWhile = o.pollWhile || ((status) => !o.isFinal(status));
    const list = o.id === undefined || o.id === null;
    const id = list ? null : Number(o.id);
    let status = o.status, finished = false, timer = null;
    function take(row) {
      if (finished || !row) return;
      o.onUpdate(row);
      if (list || row.status === undefined) return;  // e.g. a "deleted" message: onUpdate has dealt with it
      const was = status;
      status = row.status;
      if (status !== was && o.isFinal(status)) {
        finished = true;
        clearInterval(timer);
        if (o.onFinal) o.onFinal(row);
        else setTimeout(() => location.reload(), o.reloadDelay);
      }
    }
    live.on(o.type, (msg) => { if (list || Number(msg.id) === id) take(msg); });
    async function poll() {
      let data;
      try { data = await getJSON(o.url); } catch (e) { return; }  // the live dot shows the panel is unreachable
      const picked = o.pick(data);
      if (list) {
        if (!Array.isArray(picked)) return;  // an error answer: the next poll tries again
        picked.forEach(take);
        if (o.onPoll) o.onPoll(data);
      }
      else take(picked);
    }
    if (o.url) timer = setInterval(() => {
      if (finished || (!list && !pollWhile(status))) return;
      poll();
    }, o.interval);
    // refresh(): one poll now, whatever the status (e.g. its host went quiet: see onHostSilent).
    return { status: () => status, refresh: () => { if (o.url && !finished) poll(); } };
  }

  // A host whose monitor goes quiet (a cut link, the host down) sends nothing that says
  // so: fn() runs once when a host this tab has heard from is silent for `afterMs`, and
  // again after it has spoken since. The JSON API then shows its rows unreachable.
  const hostHeard = {};
  live.on("monitor", (m) => { hostHeard[m.host] = Date.now(); });
  function onHostSilent(host, fn, afterMs) {
    let told = false;
    setInterval(() => {
      const heard = hostHeard[host];
      if (heard === undefined) return;
      const silent = Date.now() - heard > (afterMs || 8000);
      if (silent && !told) fn();
      told = silent;
    }, 2000);
  }

  // A form with data-confirm="question" asks before it submits (instead of an
  // inline onsubmit handler, which a strict Content-Security-Policy forbids).
  // Declined, the submit goes no further: not to the browser, not to other listeners.
  document.addEventListener("submit", (ev) => {
    const question = ev.target.dataset && ev.target.dataset.confirm;
    if (question && !confirm(question)) { ev.preventDefault(); ev.stopPropagation(); }
  }, true);

  return { getJSON, postJSON, csrfToken, live, follow, onHostSilent };
})();
