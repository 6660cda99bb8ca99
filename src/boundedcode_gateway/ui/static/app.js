// The page of calls: four views chosen by the URL's hash, fed by /ui/api/ and its event
// stream. Plain DOM: every text goes in through textContent (or a text node), never as
// markup, and no style attribute is written (the page's CSP forbids both).
"use strict";

(() => {
  // ---------------------------------------------------------------- the page's clock and sizes

  const MODELS_EVERY_MS = 2000; // the servers' state is polled this often while shown
  const TICK_MS = 250; // elapsed times of calls in flight
  const FINISHED_KEPT = 8; // the "just finished" list
  const TIMELINE_PAGES = 4; // a task's timeline reads at most this many pages of 500
  const STREAM_RETRY_MS = 5000; // a closed event stream is opened again after this
  const NOT_MISSES = new Set(["none", "first_call"]);
  const REPAIR = "cache_repair";
  // a conversation's slot written to its slot file (docs/llama-server.md): no model call
  const SAVE = "slot_save";

  // ---------------------------------------------------------------- DOM helpers

  const byId = (id) => document.getElementById(id);

  /** An element with attributes (class, text, data: {...}, on<event>) and children. */
  function h(tag, props, ...children) {
    return fill(document.createElement(tag), props, children);
  }

  const SVG_NS = "http://www.w3.org/2000/svg";

  function svg(tag, props, ...children) {
    return fill(document.createElementNS(SVG_NS, tag), props, children);
  }

  function fill(node, props, children) {
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.setAttribute("class", value);
      else if (key === "text") node.textContent = String(value);
      else if (key === "data") {
        for (const [name, v] of Object.entries(value)) {
          if (v !== null && v !== undefined) node.dataset[name] = String(v);
        }
      } else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.firstChild.remove();
    return node;
  }

  // ---------------------------------------------------------------- numbers for people

  const fmt = {
    tokens(n) {
      if (n === null || n === undefined) return "–";
      const a = Math.abs(n);
      if (a < 1000) return String(Math.round(n));
      const k = Math.round(n / 100) / 10;
      if (Math.abs(k) < 10) return k.toFixed(1) + "k";
      if (a < 999500) return Math.round(n / 1000) + "k";
      const m = Math.round(n / 1e5) / 10;
      return (Math.abs(m) < 10 ? m.toFixed(1) : String(Math.round(m))) + "M";
    },
    ms(ms) {
      if (ms === null || ms === undefined) return "–";
      if (ms < 1000) return Math.round(ms) + " ms";
      const s = ms / 1000;
      if (s < 9.95) return s.toFixed(1) + " s";
      if (s < 59.5) return Math.round(s) + " s";
      const min = Math.floor(s / 60);
      const rest = Math.round(s - min * 60);
      if (min < 60) return rest ? `${min} min ${rest} s` : `${min} min`;
      const hours = Math.floor(min / 60);
      return `${hours} h ${min - hours * 60} min`;
    },
    seconds(s) {
      return s === null || s === undefined ? "–" : fmt.ms(s * 1000);
    },
    pct(x) {
      return x === null || x === undefined ? "–" : Math.round(x * 100) + " %";
    },
    rate(x) {
      return x < 10 ? x.toFixed(1) : String(Math.round(x));
    },
    time(iso) {
      if (!iso) return "–";
      const d = new Date(iso);
      return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
    },
    /** A time of today as its hour only; another day's with its date. */
    when(iso) {
      if (!iso) return "–";
      const d = new Date(iso);
      if (Number.isNaN(d.getTime())) return String(iso);
      return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
    },
    usd(x) {
      if (x === null || x === undefined) return "–";
      return x < 0.01 ? "$" + x.toFixed(4) : "$" + x.toFixed(2);
    },
    yesNo(b) {
      return b === null || b === undefined ? "–" : b ? "yes" : "no";
    },
  };

  /** How a call's cache went, in words: a miss with its cause and where, or none. */
  function missLabel(call) {
    const cause = call.miss_cause;
    if (!cause || cause === "none") return null;
    if (cause === "first_call") return "first call";
    if (cause === "restore_ineffective" && call.restore_failure) {
      return `restore ineffective: ${call.restore_failure}`;
    }
    const at = call.miss_at;
    if (at && at.message !== undefined && at.message !== null) {
      return `${cause} at message ${at.message}`;
    }
    return cause;
  }

  function isMiss(call) {
    return Boolean(call.miss_cause) && !NOT_MISSES.has(call.miss_cause);
  }

  // ---------------------------------------------------------------- the API

  class ApiError extends Error {}

  async function getJSON(path) {
    let resp;
    try {
      resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
    } catch (err) {
      throw new ApiError(`the gateway cannot be reached (${err.message})`);
    }
    let body = null;
    try {
      body = await resp.json();
    } catch (_) {
      body = null;
    }
    if (!resp.ok) {
      const error = body && body.error ? body.error : {};
      const code = error.code ? `, ${error.code}` : "";
      throw new ApiError(`${error.message || resp.statusText} (HTTP ${resp.status}${code})`);
    }
    return body;
  }

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
    }
    const s = q.toString();
    return s ? "?" + s : "";
  }

  /** A view's errors, each under a key so that a later success clears its own. */
  function errors(viewName) {
    const box = document.querySelector(`[data-view="${viewName}"] .errors`);
    return {
      show(key, what, err) {
        this.clear(key);
        box.append(h("p", { class: "error", data: { errorKey: key } }, `${what}: ${err.message}`));
      },
      clear(key) {
        for (const p of box.querySelectorAll("p")) {
          if (p.dataset.errorKey === key) p.remove();
        }
      },
    };
  }

  // ---------------------------------------------------------------- small shared pieces

  function badge(text, kind, data) {
    return h("span", { class: `badge badge-${kind}`, data }, text);
  }

  /** The gateway's own work that gave way to a caller's call: not a failure. (Records of
   * earlier releases have status "error" and code "abandoned".) */
  function isAbandoned(call) {
    return call.status === "abandoned" || (call.purpose === REPAIR && call.error_code === "abandoned");
  }

  function failed(call) {
    return call.status !== "ok" && !isAbandoned(call);
  }

  function statusBadge(call) {
    if (isAbandoned(call)) {
      const text = call.purpose === REPAIR ? "repair abandoned" : "abandoned";
      return badge(text, "abandoned", { status: "abandoned" });
    }
    return badge(call.status || "?", call.status === "ok" ? "ok" : "error", { status: call.status });
  }

  /** What the badge is followed by: a failure's code (an abandoned call's badge says it). */
  function errorCode(call) {
    return failed(call) ? call.error_code || "" : "";
  }

  function stateBadge(state) {
    return badge(state, `state-${state}`, { state });
  }

  function cacheCell(call) {
    const label = missLabel(call);
    if (label === null) return call.miss_cause === "none" ? h("span", { class: "muted" }, "hit") : "";
    const kind = isMiss(call) ? "miss" : "first";
    return h("span", { class: `cache-${kind}`, data: { missCause: call.miss_cause } }, label);
  }

  function callLink(callId) {
    return "#call/" + encodeURIComponent(callId);
  }

  /** A table row that opens the call's whole record. */
  function rowOpening(tr, callId) {
    tr.dataset.callId = callId;
    tr.tabIndex = 0;
    tr.classList.add("clickable");
    tr.addEventListener("click", () => (location.hash = callLink(callId)));
    tr.addEventListener("keydown", (e) => {
      if (e.key === "Enter") location.hash = callLink(callId);
    });
    return tr;
  }

  const purposeClasses = new Map([["agent_turn", 0], [REPAIR, 7]]);

  function purposeClass(purpose) {
    if (!purposeClasses.has(purpose)) purposeClasses.set(purpose, 1 + ((purposeClasses.size - 2) % 6));
    return "purpose-" + purposeClasses.get(purpose);
  }

  function purposeChip(purpose) {
    return h("span", { class: `chip ${purposeClass(purpose)}`, data: { purpose } }, purpose);
  }

  // ---------------------------------------------------------------- the event stream

  const stream = {
    source: null,
    listeners: [],
    on(listener) {
      this.listeners.push(listener);
    },
    open() {
      const source = new EventSource("api/events");
      this.source = source;
      const state = byId("stream-state");
      const show = (s, text) => {
        state.dataset.state = s;
        state.textContent = text;
      };
      source.onopen = () => show("live", "live");
      source.onerror = () => {
        if (source.readyState === EventSource.CLOSED) {
          show("closed", "disconnected");
          setTimeout(() => this.open(), STREAM_RETRY_MS);
        } else {
          show("connecting", "reconnecting");
        }
      };
      for (const kind of ["in_flight", "started", "progress", "first_token", "streaming", "finished"]) {
        source.addEventListener(kind, (e) => {
          let data;
          try {
            data = JSON.parse(e.data);
          } catch (_) {
            return;
          }
          for (const listener of this.listeners) listener(kind, data);
        });
      }
    },
  };

  // ---------------------------------------------------------------- Live

  const liveView = {
    calls: new Map(), // call id → {call, node}
    finished: [],
    timer: null,
    serversTimer: null,
    shown: false,
    errors: errors("live"),

    init() {
      stream.on((kind, data) => this.event(kind, data));
    },

    event(kind, data) {
      if (kind === "in_flight") {
        const now = Date.now();
        const fresh = new Map();
        for (const call of data.calls || []) {
          const known = this.calls.get(call.call_id);
          call.localStart = known ? known.call.localStart : Math.min(now, call.started * 1000);
          fresh.set(call.call_id, { call, node: known ? known.node : null });
        }
        for (const [id, entry] of this.calls) {
          if (!fresh.has(id) && entry.node) entry.node.remove();
        }
        this.calls = fresh;
      } else if (kind === "started") {
        data.localStart = Date.now();
        this.calls.set(data.call_id, { call: data, node: null });
      } else if (kind === "finished") {
        const entry = this.calls.get(data.call_id);
        if (entry && entry.node) entry.node.remove();
        this.calls.delete(data.call_id);
        this.finished.unshift(data);
        this.finished.length = Math.min(this.finished.length, FINISHED_KEPT);
        this.renderFinished();
      } else {
        // how one call goes: only its card is drawn again
        const entry = this.calls.get(data.call_id);
        if (!entry) return;
        const call = entry.call;
        if (kind === "progress") call.progress = data;
        else if (kind === "first_token") call.ttft_ms = data.ttft_ms;
        else if (kind === "streaming") {
          call.chunks = data.chunks;
          call.at_ms = data.at_ms;
        }
        if (entry.node) this.update(entry);
        return;
      }
      this.renderInFlight();
    },

    show() {
      this.shown = true;
      this.renderInFlight();
      this.renderFinished();
      this.timer = setInterval(() => this.tick(), TICK_MS);
      this.loadServers();
      this.serversTimer = setInterval(() => this.loadServers(), MODELS_EVERY_MS);
    },

    hide() {
      this.shown = false;
      clearInterval(this.timer);
      clearInterval(this.serversTimer);
    },

    renderInFlight() {
      const list = byId("in-flight");
      byId("in-flight-count").textContent = String(this.calls.size);
      byId("in-flight-empty").hidden = this.calls.size > 0;
      for (const entry of this.calls.values()) {
        if (!entry.node) {
          entry.node = this.card(entry.call);
          list.prepend(entry.node);
        }
        this.update(entry);
      }
    },

    card(call) {
      const fillBar = h("div", { class: "bar-fill" });
      return h(
        "li",
        { class: "card", data: { callId: call.call_id } },
        h(
          "div",
          { class: "card-head" },
          h("span", { class: "task", title: "task" }, call.task),
          purposeChip(call.purpose),
          h("span", { class: "model", title: "model profile" }, call.model),
          call.stream ? null : h("span", { class: "muted" }, "whole answer"),
          h("span", { class: "elapsed", title: "elapsed" }),
        ),
        h(
          "div",
          {
            class: "bar",
            role: "progressbar",
            "aria-label": "prompt read",
            "aria-valuemin": 0,
            "aria-valuemax": 100,
          },
          fillBar,
        ),
        h("p", { class: "phase" }),
        h("p", { class: "stats" }),
      );
    },

    update(entry) {
      const { call, node } = entry;
      const bar = node.querySelector(".bar");
      const phase = node.querySelector(".phase");
      const stats = node.querySelector(".stats");
      const p = call.progress;
      let fraction = null;
      let words;
      if (p) {
        const fresh = Math.max(0, p.total - p.cache);
        const read = Math.min(fresh, Math.max(0, p.processed - p.cache));
        fraction = fresh > 0 ? read / fresh : 1;
        const cached = p.cache ? ` (${fmt.tokens(p.cache)} from the cache)` : "";
        words =
          call.ttft_ms === undefined
            ? `reading the conversation: ${fmt.tokens(read)} of ${fmt.tokens(fresh)} new tokens${cached}`
            : `read ${fmt.tokens(fresh)} new tokens${cached}`;
      } else if (call.ttft_ms !== undefined) {
        fraction = 1;
        words = "answering";
      } else {
        words = call.stream ? "waiting for the server" : "waiting for the whole answer";
      }
      if (call.ttft_ms !== undefined) fraction = 1;
      node.dataset.phase = call.ttft_ms !== undefined ? "answering" : p ? "reading" : "waiting";
      bar.classList.toggle("indeterminate", fraction === null);
      if (fraction !== null) {
        const pct = Math.round(fraction * 1000) / 10;
        bar.dataset.progress = fraction.toFixed(3);
        bar.setAttribute("aria-valuenow", String(pct));
        bar.firstChild.style.width = pct + "%";
      } else {
        delete bar.dataset.progress;
        bar.removeAttribute("aria-valuenow");
      }
      phase.textContent = words;
      stats.textContent = this.answerStats(call);
      this.tickOne(entry, Date.now());
    },

    answerStats(call) {
      if (call.ttft_ms === undefined) return "";
      const parts = [`TTFT ${fmt.ms(call.ttft_ms)}`];
      if (call.chunks) {
        const spanS = (call.at_ms - call.ttft_ms) / 1000;
        if (spanS > 0) parts.push(`${fmt.rate(call.chunks / spanS)} tokens/s`);
        parts.push(`${fmt.tokens(call.chunks)} chunks so far`);
      }
      return parts.join(" · ");
    },

    tick() {
      const now = Date.now();
      for (const entry of this.calls.values()) this.tickOne(entry, now);
    },

    tickOne(entry, now) {
      if (!entry.node) return;
      const elapsed = entry.node.querySelector(".elapsed");
      elapsed.textContent = fmt.ms(Math.max(0, now - entry.call.localStart));
    },

    renderFinished() {
      const list = clear(byId("finished"));
      byId("finished-empty").hidden = this.finished.length > 0;
      for (const call of this.finished) {
        const tokens = [
          `${fmt.tokens(call.prompt_tokens)} prompt`,
          call.cached_tokens ? `${fmt.tokens(call.cached_tokens)} cached` : null,
          `${fmt.tokens(call.completion_tokens)} generated`,
        ].filter(Boolean);
        list.append(
          h(
            "li",
            { data: { callId: call.call_id, status: call.status } },
            h(
              "a",
              { href: callLink(call.call_id), class: "finished-link" },
              statusBadge(call),
              h("span", { class: "task" }, call.task),
              purposeChip(call.purpose),
              h("span", { class: "model" }, call.model_profile),
              h("span", { class: "muted" }, errorCode(call) || tokens.join(", ")),
              h("span", { class: "num" }, fmt.ms(call.total_ms)),
              cacheCell(call),
            ),
          ),
        );
      }
    },

    async loadServers() {
      let models;
      try {
        models = (await getJSON("api/models")).models;
        this.errors.clear("servers");
      } catch (err) {
        this.errors.show("servers", "The servers could not be read", err);
        return;
      }
      if (!this.shown) return;
      const list = clear(byId("live-servers"));
      let n = 0;
      for (const model of models) {
        for (const server of model.servers) {
          n += 1;
          const slots = server.slots ? `${server.slots.busy}/${server.slots.total} slots busy` : null;
          const what = server.managed
            ? [server.pid ? `pid ${server.pid}` : null, server.uptime_s !== null ? `up ${fmt.seconds(server.uptime_s)}` : null]
            : [server.url];
          list.append(
            h(
              "li",
              { class: "server-brief", data: { model: model.name, state: server.state } },
              h("span", { class: "model" }, server.name && server.name !== model.name ? server.name : model.name),
              stateBadge(server.state),
              h("span", { class: "muted" }, [...what, slots].filter(Boolean).join(" · ")),
            ),
          );
        }
      }
      byId("live-servers-empty").hidden = n > 0;
    },
  };

  // ---------------------------------------------------------------- Task timeline

  const taskView = {
    errors: errors("task"),
    task: null,
    search: "",
    searchTimer: null,
    refreshTimer: null,
    loading: 0,
    shown: false,
    stale: false,
    calls: null,
    more: false,

    init() {
      const input = byId("task-search");
      input.addEventListener("input", () => {
        clearTimeout(this.searchTimer);
        this.searchTimer = setTimeout(() => {
          this.search = input.value.trim();
          this.loadTasks();
        }, 250);
      });
      stream.on((kind, data) => {
        // a call finished: the picker's counts, and the timeline if it is this task's, are
        // read again once things settle
        if (kind !== "finished" || !this.shown) return;
        this.stale = this.stale || (this.task !== null && data.task === this.task);
        clearTimeout(this.refreshTimer);
        this.refreshTimer = setTimeout(() => {
          this.loadTasks();
          if (this.stale && this.task !== null) this.loadTask(this.task);
          this.stale = false;
        }, 1000);
      });
      window.addEventListener("resize", () => {
        if (this.shown && this.task !== null && this.calls) this.drawCharts();
      });
    },

    show(arg) {
      this.shown = true;
      this.task = arg || null;
      byId("task-none").hidden = this.task !== null;
      byId("task-detail").hidden = this.task === null;
      this.loadTasks();
      if (this.task !== null) this.loadTask(this.task);
    },

    hide() {
      clearTimeout(this.refreshTimer);
      this.shown = false;
      this.task = null;
    },

    async loadTasks() {
      let answer;
      try {
        answer = await getJSON("api/tasks" + query({ q: this.search, limit: 200 }));
        this.errors.clear("tasks");
      } catch (err) {
        this.errors.show("tasks", "The tasks could not be read", err);
        return;
      }
      const list = clear(byId("task-list"));
      byId("task-list-empty").hidden = answer.tasks.length > 0;
      byId("task-list-empty").textContent = answer.metering
        ? "No task found."
        : "Metering is off (metering: false): no task is recorded.";
      for (const t of answer.tasks) {
        const misses = Object.entries(t.misses || {})
          .filter(([cause]) => cause !== "first_call")
          .reduce((sum, [, n]) => sum + n, 0);
        const facts = [
          `${t.calls} call${t.calls === 1 ? "" : "s"}`,
          t.errors ? `${t.errors} failed` : null,
          t.hit_ratio !== null ? `${fmt.pct(t.hit_ratio)} cached` : null,
          misses ? `${misses} miss${misses === 1 ? "" : "es"}` : null,
        ].filter(Boolean);
        list.append(
          h(
            "li",
            { data: { task: t.task } },
            h(
              "a",
              {
                href: "#task/" + encodeURIComponent(t.task),
                "aria-current": t.task === this.task ? "page" : null,
              },
              h("span", { class: "task" }, t.task),
              h("span", { class: "muted small" }, facts.join(" · ")),
              h("span", { class: "muted small", title: fmt.time(t.last_call) }, "last call " + fmt.when(t.last_call)),
            ),
          ),
        );
      }
    },

    async loadTask(task) {
      const ticket = ++this.loading;
      byId("task-title").textContent = task;
      let calls = [];
      let more = false;
      let totals = null;
      try {
        const [first, tasks] = await Promise.all([
          getJSON("api/calls" + query({ task, limit: 500 })),
          getJSON("api/tasks" + query({ q: task, limit: 500 })),
        ]);
        calls = first.calls;
        let next = first.next;
        for (let page = 1; next && page < TIMELINE_PAGES; page++) {
          const answer = await getJSON("api/calls" + query({ task, limit: 500, before: next }));
          calls = calls.concat(answer.calls);
          next = answer.next;
        }
        more = next !== null;
        totals = tasks.tasks.find((t) => t.task === task) || null;
        this.errors.clear("task");
      } catch (err) {
        if (ticket === this.loading) this.errors.show("task", `The calls of task ${task} could not be read`, err);
        return;
      }
      if (ticket !== this.loading || this.task !== task) return;
      this.calls = calls.slice().reverse(); // oldest first
      this.more = more;
      this.renderTotals(totals);
      this.drawCharts();
      this.renderTable();
    },

    renderTotals(t) {
      const dl = clear(byId("task-totals"));
      if (t === null) {
        dl.append(h("div", {}, h("dt", {}, "Calls"), h("dd", {}, "none recorded")));
        return;
      }
      const misses = Object.entries(t.misses || {});
      const items = [
        ["Calls", `${t.calls}` + (t.errors ? ` (${t.errors} failed)` : "")],
        ["Prompt tokens", fmt.tokens(t.prompt_tokens)],
        ["Cached", `${fmt.tokens(t.cached_tokens)} (${fmt.pct(t.hit_ratio)})`],
        ["Evaluated", fmt.tokens(t.evaluated_tokens)],
        ["Prefill time", fmt.ms(t.prefill_ms)],
        ["Cache repairs", t.repairs ? `${t.repairs} (${fmt.tokens(t.repair_evaluated_tokens)} evaluated)` : "none"],
        ["Misses", misses.length ? misses.map(([cause, n]) => `${cause} ${n}`).join(", ") : "none"],
        ["First call", fmt.time(t.first_call)],
        ["Last call", fmt.time(t.last_call)],
      ];
      for (const [name, value] of items) {
        dl.append(h("div", { data: { total: name } }, h("dt", {}, name), h("dd", {}, value)));
      }
    },

    drawCharts() {
      const box = clear(byId("task-charts"));
      const calls = this.calls;
      if (!calls.length) {
        box.append(h("p", { class: "empty" }, "No call of this task is recorded."));
        return;
      }
      if (this.more) {
        box.append(h("p", { class: "note" }, `Showing the latest ${calls.length} calls of this task.`));
      }
      const width = Math.max(320, box.clientWidth || 800);
      box.append(
        h("h3", {}, "Tokens per call"),
        legend([
          ["seg-cached", "cached"],
          ["seg-evaluated", "evaluated"],
          ["seg-generated", "generated"],
          ["miss-key", "cache miss"],
        ]),
        h("div", { class: "chart-wrap" }, tokenChart(calls, width)),
        purposeLegend(calls),
        h("h3", {}, "Time per call"),
        legend([
          ["seg-prefill", "prefill"],
          ["seg-decode", "decode"],
          ["ttft-key", "time to first token"],
        ]),
        h("div", { class: "chart-wrap" }, timeChart(calls, width)),
      );
    },

    renderTable() {
      const body = clear(document.querySelector("#task-calls tbody"));
      this.calls.forEach((call, i) => {
        body.append(
          rowOpening(
            h(
              "tr",
              { class: call.purpose === REPAIR ? "repair" : null },
              h("td", { class: "num" }, String(i + 1)),
              h("td", { class: "nowrap", title: fmt.time(call.started_at) }, fmt.when(call.started_at)),
              h("td", {}, purposeChip(call.purpose)),
              h("td", {}, statusBadge(call), errorCode(call) ? " " + errorCode(call) : ""),
              h("td", { class: "num" }, fmt.tokens(call.prompt_tokens)),
              h("td", { class: "num" }, fmt.tokens(call.cached_tokens)),
              h("td", { class: "num" }, fmt.tokens(call.evaluated_tokens)),
              h("td", { class: "num" }, fmt.tokens(call.completion_tokens)),
              h("td", { class: "num" }, fmt.ms(call.ttft_ms)),
              h("td", { class: "num" }, fmt.ms(call.prefill_ms)),
              h("td", { class: "num" }, fmt.ms(call.decode_ms)),
              h("td", {}, cacheCell(call)),
            ),
            call.call_id,
          ),
        );
      });
    },
  };

  function legend(items) {
    return h(
      "ul",
      { class: "legend" },
      items.map(([cls, text]) => h("li", {}, h("span", { class: `key ${cls}` }), text)),
    );
  }

  function purposeLegend(calls) {
    const purposes = [...new Set(calls.map((c) => c.purpose))];
    return h(
      "ul",
      { class: "legend purposes" },
      h("li", { class: "muted" }, "purpose:"),
      purposes.map((p) => h("li", {}, h("span", { class: `key ${purposeClass(p)}` }), p)),
    );
  }

  // ---------------------------------------------------------------- the charts (SVG)

  const CHART = { left: 52, right: 16, bottom: 40, plot: 170, minStep: 14, maxStep: 64 };
  const CHAR_W = 6.3; // an 11 px label's average character width
  const SLANT = Math.SQRT1_2; // labels above the bars are drawn at 45°

  /** Ticks for an axis from 0 to at least max: about four, at round values. */
  function ticks(max) {
    if (!(max > 0)) return { top: 1, step: 1 };
    const raw = max / 4;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    return { top: Math.ceil(max / step) * step, step };
  }

  /** The frame both charts share: x per call, y scale, axis and turn numbers. */
  function frame(name, calls, width, max, labelOf, format) {
    const labels = calls.map(labelOf);
    const longest = Math.max(0, ...labels.map((l) => (l ? l.length : 0)));
    const top = 12 + (longest ? longest * CHAR_W * SLANT + 14 : 0);
    const n = calls.length;
    const stepFor = (right) =>
      Math.max(CHART.minStep, Math.min(CHART.maxStep, (width - CHART.left - right) / n));
    // a label near the right end may reach past the last bar: room for it, then the bars
    // narrowed to fit beside that room
    const rightFor = (step) => {
      let right = CHART.right;
      labels.forEach((l, i) => {
        if (l) right = Math.max(right, l.length * CHAR_W * SLANT + 10 - (n - 1 - i) * step);
      });
      return right;
    };
    let step = stepFor(CHART.right);
    const right = rightFor(step);
    step = stepFor(right);
    const w = Math.ceil(CHART.left + n * step + right);
    const hgt = Math.ceil(top + CHART.plot + CHART.bottom);
    const { top: yTop, step: yStep } = ticks(max);
    const y = (v) => top + CHART.plot - (v / yTop) * CHART.plot;
    const x = (i) => CHART.left + i * step;
    const root = svg("svg", {
      class: "chart",
      data: { chart: name },
      width: w,
      height: hgt,
      viewBox: `0 0 ${w} ${hgt}`,
      role: "img",
    });
    const axis = svg("g", { class: "axis" });
    for (let v = 0; v <= yTop + yStep / 2; v += yStep) {
      axis.append(
        svg("line", { x1: CHART.left - 4, x2: w - right + 4, y1: y(v), y2: y(v), class: v ? "grid" : "base" }),
        svg("text", { x: CHART.left - 8, y: y(v) + 4, "text-anchor": "end" }, format(v)),
      );
    }
    const every = Math.ceil(28 / step);
    calls.forEach((_, i) => {
      if (i % every === 0 || i === n - 1) {
        axis.append(
          svg("text", { x: x(i) + step / 2, y: top + CHART.plot + 14, "text-anchor": "middle" }, String(i + 1)),
        );
      }
    });
    axis.append(svg("text", { x: CHART.left, y: hgt - 4, class: "axis-title" }, "call"));
    root.append(axis);
    return { root, x, y, step, top, bar: Math.max(4, step * 0.7), labels };
  }

  function callTitle(call, i) {
    const lines = [
      `call ${i + 1} · ${call.purpose} · ${call.status}${call.error_code ? " " + call.error_code : ""}`,
      fmt.time(call.started_at),
      `prompt ${fmt.tokens(call.prompt_tokens)}, cached ${fmt.tokens(call.cached_tokens)}, ` +
        `evaluated ${fmt.tokens(call.evaluated_tokens)}, generated ${fmt.tokens(call.completion_tokens)}`,
      `TTFT ${fmt.ms(call.ttft_ms)}, prefill ${fmt.ms(call.prefill_ms)}, decode ${fmt.ms(call.decode_ms)}`,
    ];
    const miss = missLabel(call);
    if (miss) lines.push(`cache: ${miss}`);
    return svg("title", {}, lines.join("\n"));
  }

  function tokenParts(call) {
    if (call.purpose === SAVE) return { cached: 0, evaluated: 0, generated: 0 };
    const cached = call.cached_tokens || 0;
    const evaluated =
      call.evaluated_tokens !== null && call.evaluated_tokens !== undefined
        ? call.evaluated_tokens
        : Math.max(0, (call.prompt_tokens || 0) - cached);
    return { cached, evaluated, generated: call.completion_tokens || 0 };
  }

  /** Per call a stacked bar (cached, evaluated, generated), each miss marked and named. */
  function tokenChart(calls, width) {
    const parts = calls.map(tokenParts);
    const max = Math.max(1, ...parts.map((p) => p.cached + p.evaluated + p.generated));
    // the caller's turns are labelled; the gateway's repairs are the tasks' totals' "repairs"
    const labelOf = (c) => (c.purpose !== REPAIR && isMiss(c) ? missLabel(c) : null);
    const f = frame("tokens", calls, width, max, labelOf, fmt.tokens);
    const plotBottom = f.y(0);
    calls.forEach((call, i) => {
      const p = parts[i];
      const x0 = f.x(i) + (f.step - f.bar) / 2;
      const group = svg("a", {
        href: callLink(call.call_id),
        class: `turn${call.purpose === REPAIR ? " repair" : ""}${failed(call) ? " failed" : ""}`,
        data: { callId: call.call_id, index: i + 1, purpose: call.purpose, status: call.status },
      });
      group.append(callTitle(call, i));
      let base = 0;
      for (const [kind, value] of [
        ["cached", p.cached],
        ["evaluated", p.evaluated],
        ["generated", p.generated],
      ]) {
        if (value > 0) {
          group.append(
            svg("rect", {
              class: `seg seg-${kind}`,
              x: x0,
              y: f.y(base + value),
              width: f.bar,
              height: Math.max(0.5, f.y(base) - f.y(base + value)),
              data: { kind, tokens: value },
            }),
          );
        }
        base += value;
      }
      if (failed(call)) {
        group.append(
          svg("text", { class: "fail-mark", x: x0 + f.bar / 2, y: plotBottom - 4, "text-anchor": "middle" }, "✕"),
        );
      }
      // the purpose, as a strip under the axis
      group.append(
        svg("rect", {
          class: `purpose-strip ${purposeClass(call.purpose)}`,
          x: x0,
          y: plotBottom + 20,
          width: f.bar,
          height: 6,
          data: { purpose: call.purpose },
        }),
      );
      f.root.append(group);
      const label = f.labels[i];
      const cx = x0 + f.bar / 2;
      const barTop = f.y(base) - 3;
      if (label) {
        f.root.append(
          svg(
            "g",
            { class: "miss", data: { callId: call.call_id, missCause: call.miss_cause } },
            svg("line", { class: "miss-line", x1: cx, x2: cx, y1: f.top - 6, y2: barTop }),
            svg("path", { class: "miss-mark", d: `M${cx - 5},${barTop - 8} L${cx + 5},${barTop - 8} L${cx},${barTop} Z` }),
            svg("text", { class: "miss-label", x: cx, y: f.top - 10, transform: `rotate(-45 ${cx} ${f.top - 10})` }, label),
          ),
        );
      } else if (call.purpose === SAVE) {
        const saved = (call.adjustments || {}).slot_tokens_saved;
        f.root.append(
          svg(
            "g",
            { class: `slot-save${failed(call) ? " failed" : ""}`, data: { callId: call.call_id } },
            svg("title", {}, `slot saved: ${fmt.tokens(saved)} tokens, ${fmt.ms(call.slot_save_ms)}`),
            svg("path", {
              class: "save-mark",
              d: `M${cx},${plotBottom - 12} l5,6 l-5,6 l-5,-6 Z`,
            }),
            svg("text", { class: "save-label", x: cx, y: plotBottom - 16, "text-anchor": "middle" }, "saved"),
          ),
        );
      } else if (call.restored_tokens) {
        f.root.append(
          svg(
            "g",
            { class: "restored", data: { callId: call.call_id, restoredTokens: call.restored_tokens } },
            svg("text", { class: "restore-label", x: cx, y: barTop - 2, "text-anchor": "middle" }, "restored"),
          ),
        );
      } else if (call.miss_cause === "first_call" && call.purpose !== REPAIR) {
        f.root.append(
          svg(
            "g",
            { class: "first-call", data: { callId: call.call_id } },
            svg("text", { class: "first-label", x: cx, y: barTop - 2, "text-anchor": "middle" }, "first"),
          ),
        );
      }
    });
    return f.root;
  }

  /** Per call its prefill and decode times stacked, and a line through its TTFTs. */
  function timeChart(calls, width) {
    const max = Math.max(
      1,
      ...calls.map((c) => Math.max((c.prefill_ms || 0) + (c.decode_ms || 0), c.ttft_ms || 0)),
    );
    const f = frame("time", calls, width, max, () => null, (v) => (v ? fmt.ms(v) : "0"));
    const points = [];
    calls.forEach((call, i) => {
      const x0 = f.x(i) + (f.step - f.bar) / 2;
      const group = svg("a", {
        href: callLink(call.call_id),
        class: `turn${call.purpose === REPAIR ? " repair" : ""}`,
        data: { callId: call.call_id, index: i + 1 },
      });
      group.append(callTitle(call, i));
      let base = 0;
      for (const [kind, value] of [
        ["prefill", call.prefill_ms || 0],
        ["decode", call.decode_ms || 0],
      ]) {
        if (value > 0) {
          group.append(
            svg("rect", {
              class: `seg seg-${kind}`,
              x: x0,
              y: f.y(base + value),
              width: f.bar,
              height: Math.max(0.5, f.y(base) - f.y(base + value)),
              data: { kind, ms: value },
            }),
          );
        }
        base += value;
      }
      f.root.append(group);
      points.push(call.ttft_ms === null || call.ttft_ms === undefined ? null : [x0 + f.bar / 2, f.y(call.ttft_ms), call]);
    });
    // the line breaks where a call has no TTFT (it failed before its first token)
    let d = "";
    let pen = false;
    for (const pt of points) {
      if (pt === null) {
        pen = false;
        continue;
      }
      d += `${pen ? "L" : "M"}${pt[0].toFixed(1)},${pt[1].toFixed(1)} `;
      pen = true;
    }
    if (d) f.root.append(svg("path", { class: "ttft-line", d: d.trim() }));
    for (const pt of points) {
      if (pt === null) continue;
      f.root.append(
        svg(
          "circle",
          { class: "ttft-dot", cx: pt[0], cy: pt[1], r: 3, data: { callId: pt[2].call_id, ttftMs: pt[2].ttft_ms } },
          svg("title", {}, `TTFT ${fmt.ms(pt[2].ttft_ms)}${pt[2].ttft_derived ? " (from the server's timings)" : ""}`),
        ),
      );
    }
    return f.root;
  }

  // ---------------------------------------------------------------- Calls

  const FILTERS = ["task", "purpose", "model", "status", "since"];

  const callsView = {
    errors: errors("calls"),
    filter: {},
    next: null,
    shownIds: new Set(),
    ready: false,
    ticket: 0,

    init() {
      const form = byId("call-filters");
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        const values = {};
        for (const name of FILTERS) {
          const v = form.elements[name].value.trim();
          if (!v) continue;
          values[name] = name === "since" ? new Date(v).toISOString() : v;
        }
        location.hash = "#calls" + query(values);
      });
      form.addEventListener("reset", () => setTimeout(() => (location.hash = "#calls"), 0));
      byId("calls-more").addEventListener("click", () => this.load(true));
      stream.on((kind, data) => {
        if (kind === "finished" && this.ready) this.arrived(data);
      });
    },

    show(_arg, params) {
      this.filter = {};
      const form = byId("call-filters");
      for (const name of FILTERS) {
        const v = params.get(name) || "";
        if (v) this.filter[name] = v;
        form.elements[name].value = name === "since" && v ? localInput(v) : v;
      }
      this.load(false);
      this.fillModelNames();
    },

    hide() {
      this.ready = false;
    },

    async load(more) {
      const ticket = ++this.ticket;
      const params = { ...this.filter, limit: 50 };
      if (more) params.before = this.next;
      let answer;
      try {
        answer = await getJSON("api/calls" + query(params));
        this.errors.clear("calls");
      } catch (err) {
        if (ticket === this.ticket) this.errors.show("calls", "The calls could not be read", err);
        return;
      }
      if (ticket !== this.ticket) return;
      const body = document.querySelector("#calls-table tbody");
      if (!more) {
        clear(body);
        this.shownIds.clear();
      }
      for (const call of answer.calls) {
        if (this.shownIds.has(call.call_id)) continue;
        this.shownIds.add(call.call_id);
        body.append(this.row(call));
      }
      this.next = answer.next;
      this.ready = true;
      byId("calls-more").hidden = answer.next === null;
      byId("calls-metering").hidden = answer.metering;
      byId("calls-empty").hidden = this.shownIds.size > 0 || !answer.metering;
    },

    row(call) {
      return rowOpening(
        h(
          "tr",
          { data: { status: call.status } },
          h("td", { class: "nowrap", title: fmt.time(call.started_at) }, fmt.when(call.started_at)),
          h("td", { class: "task" }, call.task),
          h("td", {}, purposeChip(call.purpose)),
          h("td", {}, call.model_profile),
          h("td", {}, statusBadge(call), call.http_status && failed(call) ? " " + call.http_status : ""),
          h("td", { class: "code" }, errorCode(call)),
          h("td", { class: "num" }, fmt.tokens(call.prompt_tokens)),
          h("td", { class: "num" }, fmt.tokens(call.cached_tokens)),
          h("td", { class: "num" }, fmt.tokens(call.completion_tokens)),
          h("td", { class: "num" }, fmt.ms(call.ttft_ms)),
          h("td", { class: "num" }, fmt.ms(call.total_ms)),
          h("td", {}, cacheCell(call)),
        ),
        call.call_id,
      );
    },

    /** A call that just finished, put on top when it passes the filter. */
    arrived(call) {
      const f = this.filter;
      if (f.task && call.task !== f.task) return;
      if (f.purpose && call.purpose !== f.purpose) return;
      if (f.model && call.model_profile !== f.model) return;
      if (f.status && call.status !== f.status) return;
      if (f.since && new Date(call.started_at) < new Date(f.since)) return;
      if (this.shownIds.has(call.call_id)) return;
      this.shownIds.add(call.call_id);
      const row = this.row(call);
      row.classList.add("new");
      document.querySelector("#calls-table tbody").prepend(row);
      byId("calls-empty").hidden = true;
    },

    async fillModelNames() {
      try {
        const { models } = await getJSON("api/models");
        const list = clear(byId("model-names"));
        for (const m of models) list.append(h("option", { value: m.name }));
      } catch (_) {
        // only the suggestions are missing; the filter still takes any name
      }
    },
  };

  /** An ISO time as a datetime-local input's value, in the viewer's zone. */
  function localInput(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return "";
    const pad = (n) => String(n).padStart(2, "0");
    return (
      `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` +
      `T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`
    );
  }

  // ---------------------------------------------------------------- one call's record

  const FIELD_GROUPS = [
    [
      "Call",
      [
        ["call_id", "call id"],
        ["started_at", "started", fmt.time],
        ["task", "task"],
        ["purpose", "purpose"],
        ["model_profile", "model profile"],
        ["provider", "provider"],
        ["upstream_model", "upstream model"],
        ["caller", "caller"],
        ["stream", "streamed", fmt.yesNo],
      ],
    ],
    [
      "Outcome",
      [
        ["status", "status"],
        ["http_status", "HTTP status"],
        ["error_code", "error code"],
        ["finish_reason", "finish reason"],
        ["attempts", "attempts"],
        ["retried", "retried", fmt.yesNo],
        ["structured_output", "structured output"],
        ["schema_valid", "schema valid", fmt.yesNo],
        ["cost_usd", "cost", fmt.usd],
      ],
    ],
    [
      "Tokens",
      [
        ["prompt_tokens", "prompt", fmt.tokens],
        ["cached_tokens", "cached", fmt.tokens],
        ["evaluated_tokens", "evaluated", fmt.tokens],
        ["completion_tokens", "generated", fmt.tokens],
        ["reasoning_tokens", "of which reasoning", fmt.tokens],
      ],
    ],
    [
      "Time",
      [
        ["ttft_ms", "time to first token", fmt.ms],
        ["ttft_derived", "TTFT from the server's timings", fmt.yesNo],
        ["prefill_ms", "prefill", fmt.ms],
        ["decode_ms", "decode", fmt.ms],
        ["total_ms", "total", fmt.ms],
      ],
    ],
    [
      "Cache",
      [
        ["miss_cause", "miss cause"],
        ["miss_at", "where the prompt stopped matching", missAt],
        ["restored_tokens", "restored from its slot file", fmt.tokens],
        ["slot_restore_ms", "slot restore", fmt.ms],
        ["slot_save_ms", "slot save (the slot's earlier conversation)", fmt.ms],
        ["restore_failure", "why the slot file bought nothing"],
        ["reusable_tokens", "reusable from the previous call", fmt.tokens],
        ["messages", "messages"],
        ["changed", "first changed message", (v) => (v === -1 ? "none (the history only grew)" : v)],
      ],
    ],
  ];

  function missAt(at) {
    if (!at) return "–";
    return at.char !== undefined && at.char !== null
      ? `message ${at.message}, character ${at.char}`
      : `message ${at.message}`;
  }

  function plain(value) {
    if (value === null || value === undefined || value === "") return "–";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  const callView = {
    errors: errors("call"),
    ticket: 0,

    async show(callId) {
      const ticket = ++this.ticket;
      const box = clear(byId("call-detail"));
      let call;
      try {
        call = await getJSON("api/calls/" + encodeURIComponent(callId));
        this.errors.clear("call");
      } catch (err) {
        if (ticket === this.ticket) this.errors.show("call", `Call ${callId} could not be read`, err);
        return;
      }
      if (ticket !== this.ticket) return;
      box.append(
        h(
          "h2",
          { class: "call-title" },
          statusBadge(call),
          " ",
          h("span", { class: "task" }, call.task),
          " ",
          purposeChip(call.purpose),
          " ",
          h("span", { class: "model" }, call.model_profile),
        ),
        h("p", { class: "muted" }, fmt.time(call.started_at)),
      );
      const known = new Set(["attempt_log", "adjustments"]);
      const groups = h("div", { class: "field-groups" });
      for (const [title, fields] of FIELD_GROUPS) {
        const dl = h("dl", { class: "fields" });
        for (const [name, label, format] of fields) {
          known.add(name);
          const value = call[name];
          const shown = value === null || value === undefined ? "–" : format ? format(value) : plain(value);
          dl.append(
            h("div", { data: { field: name } }, h("dt", { title: name }, label), h("dd", { title: plain(value) }, String(shown))),
          );
        }
        groups.append(h("section", { class: "field-group" }, h("h3", {}, title), dl));
      }
      // a field this page does not know yet is still shown
      const others = Object.keys(call).filter((k) => !known.has(k));
      if (others.length) {
        const dl = h("dl", { class: "fields" });
        for (const name of others) {
          dl.append(h("div", { data: { field: name } }, h("dt", {}, name), h("dd", {}, plain(call[name]))));
        }
        groups.append(h("section", { class: "field-group" }, h("h3", {}, "Other"), dl));
      }
      box.append(groups, this.attempts(call.attempt_log), this.adjustments(call.adjustments));
      box.append(
        h(
          "details",
          { class: "raw" },
          h("summary", {}, "The whole record as JSON"),
          h("pre", {}, JSON.stringify(call, null, 2)),
        ),
      );
    },

    attempts(log) {
      const section = h("section", { class: "attempts" }, h("h3", {}, "Attempts"));
      if (!Array.isArray(log) || !log.length) {
        section.append(h("p", { class: "muted" }, "No attempt recorded."));
        return section;
      }
      const body = h("tbody");
      log.forEach((attempt, i) => {
        const extra = Object.entries(attempt).filter(([k]) => k !== "status" && k !== "code");
        body.append(
          h(
            "tr",
            { data: { attempt: i + 1 } },
            h("td", { class: "num" }, String(i + 1)),
            h("td", {}, plain(attempt.status)),
            h("td", { class: "code" }, attempt.code || "–"),
            h("td", {}, extra.map(([k, v]) => `${k}: ${plain(v)}`).join(", ")),
          ),
        );
      });
      section.append(
        h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "small-table" },
            h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "status"), h("th", {}, "code"), h("th", {}, ""))),
            body,
          ),
        ),
      );
      return section;
    },

    adjustments(adjustments) {
      const section = h("section", { class: "adjustments" }, h("h3", {}, "Adjustments"));
      const entries = Object.entries(adjustments || {});
      if (!entries.length) {
        section.append(h("p", { class: "muted" }, "The request went upstream as the caller sent it."));
        return section;
      }
      const dl = h("dl", { class: "fields" });
      for (const [name, value] of entries) {
        const shown = typeof value === "object" && value !== null ? h("pre", {}, JSON.stringify(value, null, 2)) : plain(value);
        dl.append(h("div", { data: { adjustment: name } }, h("dt", {}, name), h("dd", {}, shown)));
      }
      section.append(dl);
      return section;
    },
  };

  // ---------------------------------------------------------------- Models

  /** A view that reads one endpoint every MODELS_EVERY_MS while shown, and draws what
   * it answers only when that changed: ``render(answer)`` on the view. */
  function polledView(name, what, view) {
    return Object.assign(
      {
        errors: errors(name),
        timer: null,
        last: "",

        show() {
          this.last = "";
          this.load();
          this.timer = setInterval(() => this.load(), MODELS_EVERY_MS);
        },

        hide() {
          clearInterval(this.timer);
        },

        async load() {
          let answer;
          try {
            answer = await getJSON(`api/${name}`);
            this.errors.clear(name);
          } catch (err) {
            this.errors.show(name, `The ${what} could not be read`, err);
            return;
          }
          const text = JSON.stringify(answer);
          if (text === this.last) return;
          this.last = text;
          this.render(answer);
        },
      },
      view,
    );
  }

  const modelsView = polledView("models", "models", {
    render(answer) {
      const box = clear(byId("models"));
      for (const model of answer.models) box.append(this.model(model));
    },

    model(m) {
      const caps = m.capabilities;
      return h(
        "article",
        { class: "model-card", data: { model: m.name } },
        h(
          "header",
          {},
          h("h2", {}, m.name),
          h("span", { class: "muted" }, [m.provider, m.upstream_model].filter(Boolean).join(" · ")),
        ),
        m.not_ready ? h("p", { class: "warning", data: { notReady: "" } }, "Not ready: " + m.not_ready) : null,
        h("h3", {}, "Capabilities"),
        caps ? capabilityList(caps) : h("p", { class: "muted" }, "Not known yet: the upstream did not tell."),
        h("h3", {}, "Servers"),
        m.servers.length
          ? m.servers.map((s) => server(s))
          : h("p", { class: "muted" }, "A cloud API: no server of its own."),
      );
    },
  });

  // ---------------------------------------------------------------- Limits

  const limitsView = polledView("limits", "limits", {
    render(answer) {
      const amount = (limit, x) => (limit === "max_cost_usd" ? fmt.usd(x) : fmt.tokens(x));
      this.table("budgets", answer.budgets, (b) => [
        b.holder, b.name, b.per, b.limit,
        amount(b.limit, b.spent), amount(b.limit, b.held), amount(b.limit, b.allowed), amount(b.limit, b.left),
      ], (b) => ({ holder: b.holder, name: b.name, limit: b.limit, left: b.left <= 0 ? "none" : "some" }));
      this.table("windows", answer.windows, (w) => [
        w.holder, w.name, w.metric, fmt.tokens(Math.round(w.used)), fmt.tokens(w.limit), `${w.window_s} s`,
      ], (w) => ({ holder: w.holder, name: w.name, metric: w.metric, full: w.used >= w.limit ? "yes" : "no" }));
      this.table("in-flight", answer.in_flight, (f) => [
        f.holder, f.name, String(f.in_flight), String(f.waiting), String(f.limit), f.per_caller === null ? "–" : String(f.per_caller),
      ], (f) => ({ holder: f.holder, name: f.name }));
    },

    table(name, rows, cells, data) {
      const table = byId(`limits-${name}`);
      byId(`limits-${name}-empty`).hidden = rows.length > 0;
      table.hidden = rows.length === 0;
      const body = clear(table.querySelector("tbody"));
      for (const row of rows) body.append(h("tr", { data: data(row) }, cells(row).map((c) => h("td", {}, c))));
    },
  });

  function capabilityList(caps) {
    return h(
      "ul",
      { class: "capabilities" },
      Object.entries(caps)
        .filter(([, value]) => value !== null && value !== undefined)
        .map(([name, value]) => {
        if (typeof value === "boolean") {
          return h("li", { class: value ? "cap-yes" : "cap-no", data: { capability: name } }, `${value ? "✓" : "✗"} ${name}`);
        }
        const shown = name === "context_tokens" && typeof value === "number" ? fmt.tokens(value) : plain(value);
        return h("li", { class: "cap-value", data: { capability: name } }, `${name}: ${shown}`);
      }),
    );
  }

  function server(s) {
    const facts = s.managed
      ? [
          ["pid", s.pid === null ? "–" : String(s.pid)],
          ["port", s.port === null ? "–" : String(s.port)],
          ["uptime", fmt.seconds(s.uptime_s)],
          ["restarts", String(s.restarts)],
        ]
      : [["url", s.url || "–"]];
    if (s.reason) facts.push(["reason", s.reason]);
    const r = s.routing; // a server of a pool: what routing knows of it (docs/scaling.md)
    if (r) {
      facts.push([
        "routing",
        [
          r.healthy ? "up" : "down",
          `${r.in_flight} in flight`,
          `${r.conversations} conversations, ${fmt.tokens(r.held_tokens)} tokens expected cached`,
          r.prefill_tps === null ? null : `prefill ${fmt.tokens(r.prefill_tps)} tok/s`,
        ]
          .filter(Boolean)
          .join(" · "),
      ]);
    }
    const slots = s.slots
      ? [
          `${s.slots.busy} of ${s.slots.total} busy`,
          h(
            "ul",
            { class: "slots" },
            s.slots.slots.map((slot) =>
              h(
                "li",
                {
                  class: slot.busy ? "slot busy" : "slot",
                  title: `slot ${slot.id}: ${slot.busy ? "busy" : "idle"}, ${fmt.tokens(slot.cached_tokens)} of ${fmt.tokens(slot.n_ctx)} tokens cached`,
                },
                String(slot.id),
              ),
            ),
          ),
        ]
      : "–";
    facts.push(["slots", slots]);
    if (s.restoring_slots === false) {
      // a restore on a server like it was evaluated again: not tried blindly again
      facts.push(["slot files", "not restored here (a restore was evaluated again)"]);
    }
    return h(
      "div",
      { class: "server", data: { managed: s.managed, state: s.state, pid: s.pid } },
      h(
        "div",
        { class: "server-head" },
        stateBadge(s.state),
        h("span", {}, (s.name ? s.name + ": " : "") + (s.managed ? "llama-server run by the gateway" : "a server you run")),
      ),
      h(
        "dl",
        { class: "fields compact" },
        facts.map(([k, v]) => h("div", { data: { field: k } }, h("dt", {}, k), h("dd", {}, v))),
      ),
      s.managed && s.argv.length ? h("details", { class: "argv" }, h("summary", {}, "Flags"), h("code", {}, shellWords(s.argv))) : null,
    );
  }

  function shellWords(argv) {
    return argv.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'")).join(" ");
  }

  // ---------------------------------------------------------------- the views, by hash

  const VIEWS = {
    live: liveView,
    task: taskView,
    calls: callsView,
    call: callView,
    models: modelsView,
    limits: limitsView,
  };
  let current = null;

  function route() {
    const hash = decodeHash(location.hash.slice(1)) || "live";
    const [path, search] = splitOnce(hash, "?");
    const [name, arg] = splitOnce(path, "/");
    const view = VIEWS[name] ? name : "live";
    if (current && VIEWS[current].hide) VIEWS[current].hide();
    current = view;
    for (const section of document.querySelectorAll("section.view")) {
      section.hidden = section.dataset.view !== view;
    }
    const tab = view === "call" ? "calls" : view;
    for (const link of document.querySelectorAll("[data-view-link]")) {
      if (link.dataset.viewLink === tab) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    document.title = `${titles[view]} · BoundedCode gateway`;
    VIEWS[view].show(arg ? decoded(arg) : null, new URLSearchParams(search || ""));
  }

  function decoded(text) {
    try {
      return decodeURIComponent(text);
    } catch (_) {
      return text; // a hash typed by hand, not one this page wrote
    }
  }

  const titles = { live: "Live", task: "Task timeline", calls: "Calls", call: "Call", models: "Models" };

  function decodeHash(h) {
    return h.startsWith("/") ? h.slice(1) : h;
  }

  function splitOnce(text, sep) {
    const i = text.indexOf(sep);
    return i < 0 ? [text, null] : [text.slice(0, i), text.slice(i + 1)];
  }

  liveView.init();
  taskView.init();
  callsView.init();
  stream.open();
  window.addEventListener("hashchange", route);
  route();
})();
