// agentcell dashboard: plain JavaScript, no build step, nothing fetched from elsewhere.
//
// Data flow: GET /overview gives every hosted session at once (each row with the seq of the last event
// folded into it); one Server-Sent Events stream of all sessions (every type but the deltas) keeps the
// rows live. Events only change data; the DOM is written once per animation frame, and the table renders
// only the rows in view, so a thousand busy sessions cost a few dozen row updates a frame.
// The bearer token lives in sessionStorage and travels in the Authorization header: the event streams
// are read with fetch() and a streaming body (EventSource cannot send headers), so no URL carries it.
"use strict";

(() => {
  const TOKEN_KEY = "agentcell.token";
  const ROW_HEIGHT = 30; // px; matches --row in style.css
  const OVERSCAN = 8; // rows rendered above and below the visible ones
  const TIMELINE_LIMIT = 400; // top-level timeline entries kept in the page
  const REPLAY_EVENTS = 5000; // a session view replays at most this many seqs of its history
  const MESSAGES_LIMIT = 300; // messages shown (the newest)
  const ACTIVE = new Set(["running", "streaming", "queued", "executing_tools"]); // queued: waiting for a provider key's capacity

  const $ = (id) => document.getElementById(id);
  const stats = { events: 0, frames: 0, rowWrites: 0, flushMs: 0, maxFlushMs: 0, overviews: 0 };

  // -- formatting -------------------------------------------------------------------------------------
  const nf = new Intl.NumberFormat("en-US");
  const int = (n) => (n == null ? "–" : nf.format(Math.round(n)));
  function short(n) {
    if (n == null) return "–";
    if (n < 1000) return String(Math.round(n));
    if (n < 1e6) return (n / 1e3).toFixed(n < 1e4 ? 1 : 0) + "k";
    return (n / 1e6).toFixed(n < 1e7 ? 2 : 1) + "M";
  }
  const cost = (c) => (c == null ? "–" : "$" + (c < 0.01 && c > 0 ? c.toFixed(4) : c.toFixed(2)));
  function ago(seconds) {
    if (seconds == null || !isFinite(seconds)) return "–";
    const s = Math.max(0, seconds);
    if (s < 60) return Math.floor(s) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 86400) return Math.floor(s / 3600) + "h";
    return Math.floor(s / 86400) + "d";
  }
  function duration(s) {
    if (s == null) return "";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 1 : 0) + " ms";
    if (s < 60) return s.toFixed(1) + " s";
    return Math.floor(s / 60) + "m " + Math.round(s % 60) + "s";
  }
  function clock(ts) {
    if (!ts) return "";
    const d = new Date(ts * 1000);
    return d.toTimeString().slice(0, 8);
  }
  const clip = (text, n) => (text.length <= n ? text : text.slice(0, n - 1) + "…");
  const plural = (n, word, many) => `${int(n)} ${n === 1 ? word : many || word + "s"}`;
  // What the figures' sources and the compactions' triggers mean, in words (the API's names are terse).
  const SOURCES = {
    actual: "actual",
    estimated: "estimated",
    back_calculated: "back-calculated",
    configured: "configured",
  };
  const SOURCE_HINTS = {
    actual: "the provider's own count",
    estimated: "counted here with a tokenizer",
    back_calculated: "the provider's count for the whole request, less the parts counted here",
    configured: "from the configuration",
  };
  const TRIGGERS = {
    threshold: "at the threshold",
    overflow: "after an overflow",
    manual: "asked for",
    usage_overflow: "after a silent overflow",
  };
  // An overflow compaction's cause: the provider refused the request, or the runtime counted it over the
  // limit and compacted before sending it (older runtimes say neither).
  const triggerText = (ev) =>
    ev.trigger === "overflow" && ev.cause === "counted"
      ? "before an overflow (the next request was over the limit)"
      : TRIGGERS[ev.trigger] || ev.trigger;
  const CACHE_BREAKS = {
    system_prompt: "the system prompt changed",
    tools: "the tools changed",
    model_switch: "the model changed",
    compaction: "a compaction rewrote the history",
    unknown: "the provider no longer had the prefix",
  };
  const NO_COST =
    "no price known: the provider reported no cost and litellm has no price for this model (a local or custom model)";

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v == null || v === false) continue;
        if (k === "class") node.className = v;
        else if (k === "text") node.textContent = v;
        else if (k === "dataset") Object.assign(node.dataset, v);
        else if (k === "style") Object.assign(node.style, v); // CSSOM: the CSP allows no style attributes
        else node.setAttribute(k, v === true ? "" : v);
      }
    }
    for (const c of children) if (c != null) node.append(c);
    return node;
  }

  // Server time: event timestamps are the server's clock; the page measures ages against it.
  let skew = 0;
  const now = () => Date.now() / 1000 + skew;

  // -- the token and the API ------------------------------------------------------------------------
  const auth = {
    get token() {
      return sessionStorage.getItem(TOKEN_KEY);
    },
    set(value) {
      sessionStorage.setItem(TOKEN_KEY, value);
    },
    clear() {
      sessionStorage.removeItem(TOKEN_KEY);
    },
  };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + auth.token };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (response.status === 401) {
      unauthorized();
      throw new ApiError(401, "the server refused the token");
    }
    if (!response.ok) throw new ApiError(response.status, (data && data.error) || response.statusText);
    return data;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // Server-Sent Events over fetch: the Authorization header goes with the request. Reconnects with
  // backoff; with `resume`, it sends the last event id back in Last-Event-ID so the server replays
  // what the stream missed.
  class EventStream {
    constructor(path, { lastEventId = null, resume = true, onEvent, onOpen, onState }) {
      this.path = path;
      this.lastEventId = lastEventId;
      this.resume = resume;
      this.onEvent = onEvent;
      this.onOpen = onOpen || (() => {});
      this.onState = onState || (() => {});
      this.closed = false;
      this.controller = null;
    }
    start() {
      this.run();
      return this;
    }
    close() {
      this.closed = true;
      if (this.controller) this.controller.abort();
    }
    async run() {
      let delay = 500;
      while (!this.closed) {
        this.controller = new AbortController();
        try {
          const headers = { Authorization: "Bearer " + auth.token, Accept: "text/event-stream" };
          if (this.lastEventId) headers["Last-Event-ID"] = this.lastEventId;
          const response = await fetch(this.path, {
            headers,
            cache: "no-store",
            signal: this.controller.signal,
          });
          if (response.status === 401) {
            unauthorized();
            return;
          }
          if (!response.ok) {
            let message = response.statusText;
            try {
              message = (await response.json()).error || message;
            } catch (_) {
              /* not JSON */
            }
            throw new ApiError(response.status, message);
          }
          this.onState("live");
          this.onOpen();
          delay = 500;
          await this.read(response.body);
        } catch (err) {
          if (this.closed) return;
          if (err instanceof ApiError && err.status === 404) {
            this.onState("gone", err.message);
            return;
          }
        }
        if (this.closed) return;
        if (!this.resume) this.lastEventId = null;
        this.onState("reconnecting");
        await sleep(delay);
        delay = Math.min(delay * 2, 10000);
      }
    }
    async read(body) {
      const reader = body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done || this.closed) return;
        buffer += value;
        let start = 0;
        let end;
        while ((end = buffer.indexOf("\n\n", start)) >= 0) {
          this.dispatch(buffer.slice(start, end));
          start = end + 2;
        }
        buffer = buffer.slice(start);
      }
    }
    dispatch(block) {
      let data = null;
      for (const line of block.split("\n")) {
        if (!line || line[0] === ":") continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value[0] === " ") value = value.slice(1);
        if (field === "id") this.lastEventId = value;
        else if (field === "data") data = data === null ? value : data + "\n" + value;
      }
      if (data === null) return;
      let event;
      try {
        event = JSON.parse(data);
      } catch (_) {
        return;
      }
      this.onEvent(event);
    }
  }

  // -- frames: every DOM write happens here, once per animation frame --------------------------------
  const renderers = new Set();
  let frameRequested = false;
  function schedule(renderer) {
    renderers.add(renderer);
    if (!frameRequested) {
      frameRequested = true;
      requestAnimationFrame(flush);
    }
  }
  function flush() {
    frameRequested = false;
    const started = performance.now();
    const work = [...renderers];
    renderers.clear();
    for (const render of work) {
      try {
        render();
      } catch (err) {
        console.error(err);
      }
    }
    stats.frames += 1;
    stats.flushMs = performance.now() - started;
    stats.maxFlushMs = Math.max(stats.maxFlushMs, stats.flushMs);
  }

  let toastTimer = null;
  function toast(message, bad = false) {
    const node = $("toast");
    node.textContent = message;
    node.className = "toast" + (bad ? " bad" : "");
    node.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => (node.hidden = true), 4000);
  }

  // -- the sessions --------------------------------------------------------------------------------
  // One row per hosted session, folded from events by the rules of runtime/apps/dashboard/board.py.
  const table = {
    rows: new Map(),
    order: [],
    orderDirty: true,
    sortKey: "id",
    sortDir: 1,
    filter: "",
    stateFilter: "all",
    eventTypes: null,
    pool: [],
    spacerTop: null,
    spacerBottom: null,
  };

  function newRow(id) {
    return {
      id,
      model: "",
      state: "new",
      compacting: false,
      window: 0,
      threshold: null,
      context_tokens: null,
      input_tokens: 0,
      output_tokens: 0,
      cost: null,
      costs: null,
      cache_read_tokens: 0,
      cache_hit: null,
      cache_saved: null,
      compactions: 0,
      turns: 0,
      title: null,
      errors: 0,
      last_error: null,
      last_type: null,
      last_ts: null,
      created: null,
      parent: null,
      seq: 0,
    };
  }

  function applyEvent(row, ev) {
    if (ev.seq) {
      if (ev.seq <= row.seq) return false; // the overview had it already
      row.seq = ev.seq;
    }
    row.last_type = ev.type;
    row.last_ts = ev.ts;
    switch (ev.type) {
      case "status_update":
        row.state = ev.state;
        break;
      case "session_started":
        row.model = ev.model;
        row.window = ev.context_window;
        if (!ev.resumed) row.created = ev.ts;
        break;
      case "session_hibernated":
        row.state = "parked";
        break;
      case "session_dead":
        row.state = "dead";
        row.last_error = ev.message;
        row.errors += 1;
        break;
      case "model_changed":
        row.model = ev.model;
        row.window = ev.context_window;
        requestOverview(); // the compaction threshold follows the window
        break;
      case "window_learned":
        row.window = ev.new;
        requestOverview();
        break;
      case "usage_update":
        row.input_tokens = ev.totals.input_tokens || 0;
        row.output_tokens = ev.totals.output_tokens || 0;
        row.cost = ev.totals.cost == null ? null : ev.totals.cost;
        row.costs = ev.totals.costs || null;
        row.cache_read_tokens = ev.totals.cache_read_tokens || 0;
        row.cache_hit = row.input_tokens ? row.cache_read_tokens / row.input_tokens : null;
        row.cache_saved = row.costs ? row.costs.without_cache - costTotal(row.costs) : null;
        row.context_tokens = ev.context_tokens;
        if (ev.context_window) row.window = ev.context_window;
        break;
      case "agent_end": // (a failed turn's error event counted it)
        row.turns += 1;
        if (ev.context_tokens) row.context_tokens = ev.context_tokens;
        break;
      case "message_appended":
        if (ev.preview && !row.title) row.title = ev.preview;
        break;
      case "compaction_start":
        row.compacting = true;
        break;
      case "compaction_end":
        row.compacting = false;
        row.compactions += 1;
        row.context_tokens = ev.tokens_after;
        break;
      case "compaction_failed":
        row.compacting = false;
        row.last_error = ev.error;
        break;
      case "compaction_skipped":
        row.compacting = false;
        break;
      case "error":
        row.errors += 1;
        row.last_error = ev.message;
        break;
      default:
        break;
    }
    if (row.state === "parked" && ev.type !== "session_hibernated") row.state = "idle"; // running again
    return true;
  }

  let overviewBuffer = null; // events that arrive while an overview is on its way
  let overviewTimer = null;
  let overviewBusy = false;
  let overviewAgain = false;

  function requestOverview(delay = 800) {
    if (overviewBusy) {
      overviewAgain = true;
      return;
    }
    if (overviewTimer) return;
    overviewTimer = setTimeout(() => {
      overviewTimer = null;
      loadOverview();
    }, delay);
  }

  async function loadOverview() {
    if (overviewBusy) {
      overviewAgain = true;
      return;
    }
    overviewBusy = true;
    overviewBuffer = overviewBuffer || [];
    try {
      ingestOverview(await api("GET", "/overview"));
    } catch (err) {
      if (err.status !== 401) toast("Could not load the sessions: " + err.message, true);
      const buffered = overviewBuffer || [];
      overviewBuffer = null;
      ingestEvents(buffered);
    } finally {
      overviewBusy = false;
      if (overviewAgain) {
        overviewAgain = false;
        requestOverview();
      }
    }
  }

  // A snapshot replaces the rows; the events that arrived meanwhile are applied on top (by seq).
  function ingestOverview(snapshot) {
    stats.overviews += 1;
    skew = snapshot.now - Date.now() / 1000;
    table.eventTypes = snapshot.event_types;
    const rows = new Map();
    for (const data of snapshot.sessions) {
      const row = Object.assign(newRow(data.id), data);
      rows.set(row.id, row);
    }
    table.rows = rows;
    const buffered = overviewBuffer || [];
    overviewBuffer = null;
    ingestEvents(buffered);
    table.orderDirty = true;
    schedule(renderTable);
    schedule(renderCounts);
    if (view.name === "session") schedule(renderSessionHead);
  }

  function ingestEvents(events) {
    if (overviewBuffer !== null) {
      overviewBuffer.push(...events);
      return;
    }
    let changed = false;
    for (const ev of events) {
      stats.events += 1;
      let row = table.rows.get(ev.session_id);
      if (ev.type === "session_stopped") {
        changed = table.rows.delete(ev.session_id) || changed;
        continue;
      }
      if (row === undefined) {
        if (ev.type === "subscriber_lagged") {
          requestOverview();
          continue;
        }
        row = newRow(ev.session_id);
        table.rows.set(row.id, row);
        requestOverview(); // its model, window and threshold
      }
      if (ev.type === "subscriber_lagged") requestOverview();
      changed = applyEvent(row, ev) || changed;
    }
    if (changed) {
      table.orderDirty = true;
      schedule(renderTable);
      schedule(renderCounts);
      if (view.name === "session") schedule(renderSessionHead);
    }
  }

  // The header's counts, in every view: "N sessions · M active" (running, streaming, running tools, or
  // compacting).
  function renderCounts() {
    let active = 0;
    for (const row of table.rows.values()) if (ACTIVE.has(row.state) || row.compacting) active += 1;
    $("counts").textContent = `${plural(table.rows.size, "session")} · ${nf.format(active)} active`;
  }

  let mainStream = null;
  function startMainStream() {
    if (mainStream) mainStream.close();
    const types = table.eventTypes ? "?type=" + table.eventTypes.join(",") : "";
    mainStream = new EventStream("/events" + types, {
      resume: false,
      onEvent: (ev) => ingestEvents([ev]),
      onOpen: () => {
        overviewBuffer = overviewBuffer || [];
        loadOverview();
      },
      onState: (state) => {
        const node = $("conn");
        node.dataset.state = state === "live" ? "live" : "reconnecting";
        node.textContent = state === "live" ? "live" : "reconnecting…";
      },
    }).start();
  }

  // The row's place in the table: filter, then sort.
  function displayState(row) {
    return row.compacting && row.state !== "dead" ? "compacting" : row.state;
  }
  function sortValue(row, key) {
    switch (key) {
      case "context":
        return row.window ? (row.context_tokens || 0) / row.window : 0;
      case "state":
        return displayState(row);
      default:
        return row[key];
    }
  }
  function matches(row) {
    const f = table.stateFilter;
    if (f === "active" && !(ACTIVE.has(row.state) || row.compacting)) return false;
    if (f === "idle" && row.state !== "idle") return false;
    if (f === "parked" && row.state !== "parked" && row.state !== "new") return false;
    if (f === "errors" && !(row.errors > 0 || row.state === "dead")) return false;
    if (!table.filter) return true;
    const text = table.filter;
    return (
      row.id.toLowerCase().includes(text) ||
      (row.model || "").toLowerCase().includes(text) ||
      displayState(row).includes(text) ||
      (row.last_type || "").includes(text)
    );
  }
  function recomputeOrder() {
    const key = table.sortKey;
    const dir = table.sortDir;
    const list = [];
    for (const row of table.rows.values()) if (matches(row)) list.push(row);
    list.sort((a, b) => {
      const x = sortValue(a, key);
      const y = sortValue(b, key);
      if (x === y) return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
      if (x == null) return 1; // unknowns last, whatever the direction
      if (y == null) return -1;
      return (x < y ? -1 : 1) * dir;
    });
    table.order = underParents(list);
    table.orderDirty = false;
  }

  // Sub-agents right under their parent (in the sorted order among themselves), indented; a sub-agent
  // whose parent is not shown stays where the sort put it.
  function underParents(list) {
    const shown = new Set(list.map((row) => row.id));
    const children = new Map();
    for (const row of list) {
      if (row.parent && shown.has(row.parent) && row.parent !== row.id) {
        if (!children.has(row.parent)) children.set(row.parent, []);
        children.get(row.parent).push(row);
      }
    }
    if (!children.size) {
      for (const row of list) row.depth = 0;
      return list;
    }
    const out = [];
    const placed = new Set();
    const visit = (row, depth) => {
      if (placed.has(row.id)) return;
      placed.add(row.id);
      row.depth = depth;
      out.push(row);
      for (const kid of children.get(row.id) || []) visit(kid, depth + 1);
    };
    for (const row of list) if (!(row.parent && shown.has(row.parent))) visit(row, 0);
    for (const row of list) visit(row, 0); // a cycle, were there one
    return out;
  }

  function makeRow() {
    const tr = el("tr", { class: "row" });
    const cell = (cls) => {
      const td = el("td", { class: cls });
      tr.append(td);
      return td;
    };
    const c = {
      id: cell("c-id"),
      state: cell("c-state"),
      model: cell("c-model"),
      ctx: cell("c-ctx"),
      input: cell("c-in num"),
      output: cell("c-out num"),
      cache: cell("c-cache num"),
      cost: cell("c-cost num"),
      compactions: cell("c-compactions num"),
      turns: cell("c-turns num"),
      last: cell("c-last"),
      age: cell("c-age num"),
    };
    c.badge = el("span", { class: "state" });
    c.err = el("span", { class: "badge-err" });
    c.state.append(c.badge, c.err);
    c.fill = el("span", { class: "fill" });
    c.mark = el("span", { class: "mark" });
    c.label = el("span", { class: "label" });
    c.ctx.append(el("div", { class: "ctx" }, el("div", { class: "track" }, c.fill, c.mark), c.label));
    tr._cells = c;
    tr._values = {};
    return tr;
  }

  function put(tr, key, node, value, apply) {
    if (tr._values[key] === value) return;
    tr._values[key] = value;
    stats.rowWrites += 1;
    if (apply) apply(value);
    else node.textContent = value;
  }

  function bindRow(tr, row, t) {
    const c = tr._cells;
    if (tr.dataset.id !== row.id) tr.dataset.id = row.id;
    put(tr, "id", c.id, `${row.depth || 0}|${row.id}|${row.title || ""}`, () => {
      const kid = row.depth ? el("span", { class: "sub", text: "↳ ".padStart(2 * row.depth + 1, " ") }) : null;
      const title = row.title ? el("span", { class: "title", text: row.title }) : null;
      c.id.replaceChildren(...[kid, el("span", { class: "sid", text: row.id }), title].filter(Boolean));
      c.id.title = row.id + (row.title ? "\n" + row.title : "") + (row.parent ? "\nsub-agent of " + row.parent : "");
    });
    const state = displayState(row);
    put(tr, "state", c.badge, state, (v) => {
      c.badge.textContent = v;
      c.badge.className = "state s-" + v;
    });
    put(tr, "err", c.err, row.errors ? "⚠ " + row.errors : "", (v) => {
      c.err.textContent = v;
      c.err.title = row.last_error || "";
    });
    put(tr, "model", c.model, row.model || "");
    const used = row.context_tokens;
    const win = row.window || 0;
    const pct = win && used != null ? Math.min(100, (100 * used) / win) : 0;
    const th = win && row.threshold ? Math.min(100, (100 * row.threshold) / win) : null;
    const level = row.threshold && used != null ? used / row.threshold : 0;
    put(tr, "fill", c.fill, pct.toFixed(1) + (level >= 1 ? " over" : level >= 0.8 ? " warn" : ""), (v) => {
      const [w, cls] = v.split(" ");
      c.fill.style.width = w + "%";
      c.fill.className = "fill" + (cls ? " " + cls : "");
    });
    put(tr, "mark", c.mark, th == null ? "" : th.toFixed(1), (v) => {
      c.mark.style.display = v ? "" : "none";
      if (v) c.mark.style.left = v + "%";
    });
    put(
      tr,
      "label",
      c.label,
      (used == null ? "–" : short(used)) + " / " + (row.threshold ? short(row.threshold) : "–") + " / " + short(win),
    );
    put(tr, "title", c.ctx, `${int(used)} used · compacts at ${int(row.threshold)} · window ${int(win)}`, (v) => {
      c.ctx.title = v;
    });
    put(tr, "in", c.input, int(row.input_tokens));
    put(tr, "out", c.output, int(row.output_tokens));
    put(tr, "cache", c.cache, row.cache_hit == null ? "–" : Math.round(100 * row.cache_hit) + "%", (v) => {
      c.cache.textContent = v;
      c.cache.title = `${int(row.cache_read_tokens)} of ${int(row.input_tokens)} input tokens read from the cache`;
    });
    put(tr, "cost", c.cost, cost(row.cost) + "|" + cost(row.cache_saved), () => {
      c.cost.textContent = cost(row.cost);
      c.cost.title = row.cost == null ? NO_COST : costTitle(row);
    });
    put(tr, "compactions", c.compactions, int(row.compactions));
    put(tr, "turns", c.turns, int(row.turns));
    put(tr, "last", c.last, row.last_type ? `${row.last_type} · ${ago(t - row.last_ts)} ago` : "–");
    put(tr, "age", c.age, row.created ? ago(t - row.created) : "–");
  }

  function renderTable() {
    if (view.name !== "sessions") return;
    if (table.orderDirty) recomputeOrder();
    const body = $("rows");
    if (!table.spacerTop) {
      table.spacerTop = el("tr", { class: "spacer" }, el("td", { colspan: "12" }));
      table.spacerBottom = el("tr", { class: "spacer" }, el("td", { colspan: "12" }));
      body.append(table.spacerTop, table.spacerBottom);
    }
    const wrap = $("table-wrap");
    const total = table.order.length;
    const headHeight = $("sessions").tHead.offsetHeight || ROW_HEIGHT;
    const top = Math.max(0, wrap.scrollTop - headHeight);
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const visible = Math.ceil((wrap.clientHeight || 800) / ROW_HEIGHT) + 2 * OVERSCAN;
    const last = Math.min(total, first + visible);
    const count = last - first;
    while (table.pool.length < count) {
      const tr = makeRow();
      table.pool.push(tr);
      body.insertBefore(tr, table.spacerBottom);
    }
    while (table.pool.length > count) table.pool.pop().remove();
    table.spacerTop.firstChild.style.height = first * ROW_HEIGHT + "px";
    table.spacerBottom.firstChild.style.height = (total - last) * ROW_HEIGHT + "px";
    const t = now();
    for (let i = 0; i < count; i++) bindRow(table.pool[i], table.order[first + i], t);

    $("empty").hidden = table.rows.size > 0;
    renderTotals();
    $("shown").textContent =
      total === table.rows.size ? "" : `${nf.format(total)} of ${nf.format(table.rows.size)} shown`;
    for (const th of $("sessions").tHead.rows[0].cells) {
      if (th.dataset.key === table.sortKey)
        th.setAttribute("aria-sort", table.sortDir > 0 ? "ascending" : "descending");
      else th.removeAttribute("aria-sort");
    }
  }

  // The totals of the sessions shown (the filter applies): tokens in and out, the share read from the cache,
  // cost and what the cache saved.
  function renderTotals() {
    let input = 0;
    let output = 0;
    let read = 0;
    let spent = null;
    let saved = null;
    for (const row of table.order) {
      input += row.input_tokens || 0;
      output += row.output_tokens || 0;
      read += row.cache_read_tokens || 0;
      if (row.cost != null) spent = (spent || 0) + row.cost;
      if (row.cache_saved != null) saved = (saved || 0) + row.cache_saved;
    }
    const node = $("totals");
    const hit = input ? ` (${Math.round((100 * read) / input)}% cached)` : "";
    const kept = saved == null ? "" : ` · ${cost(saved)} saved by the cache`;
    node.textContent = `total: ${int(input)} in${hit} · ${int(output)} out · ${cost(spent)}${kept}`;
    node.title = spent == null ? "cost: " + NO_COST : "the sessions shown; cost where a price is known";
  }

  function costTotal(c) {
    return (c.input || 0) + (c.cache_read || 0) + (c.cache_write || 0) + (c.output || 0);
  }

  // A cost cell's title: its split by kind of token and what the cache saved.
  function costTitle(row) {
    const c = row.costs;
    if (!c) return "";
    return (
      `input ${cost(c.input || 0)} · cache read ${cost(c.cache_read || 0)} · cache write ${cost(c.cache_write || 0)}` +
      ` · output ${cost(c.output || 0)}\n${cost(row.cache_saved)} saved by the cache`
    );
  }

  // -- one session ----------------------------------------------------------------------------------
  let sv = null; // the open session view's state

  function openSession(id) {
    closeSession();
    sv = {
      id,
      items: [], // top-level timeline entries, oldest first
      turns: new Map(),
      calls: new Map(),
      openTurn: null,
      compaction: null,
      dirty: new Set(),
      fresh: [],
      requests: 0,
      reply: "",
      replyDirty: false,
      streams: [],
      timers: {},
      state: null,
      trimmed: false,
      messagesBusy: false,
      points: [], // the context's size over time, for the chart: {ts, tokens, compaction?}
    };
    $("s-title").textContent = id;
    $("timeline").replaceChildren();
    $("messages").replaceChildren();
    delete $("messages").dataset.loaded;
    $("ctx-bar").replaceChildren();
    $("ctx-legend").replaceChildren();
    $("ctx-caption").textContent = "";
    $("chart-caption").textContent = "";
    $("ctx-chart").replaceChildren();
    $("s-subtitle").textContent = "";
    $("tl-caption").textContent = "";
    $("msg-caption").textContent = "";
    $("live-reply").hidden = true;
    $("prompt-status").textContent = "";
    schedule(renderSessionHead);

    const row = table.rows.get(id);
    const from = row && row.seq > REPLAY_EVENTS ? row.seq - REPLAY_EVENTS : 0;
    sv.trimmed = from > 0;
    const types = (table.eventTypes || []).join(",");
    const enc = encodeURIComponent(id);
    const current = sv;
    sv.streams.push(
      new EventStream(`/events?session=${enc}` + (types ? "&type=" + types : ""), {
        lastEventId: `${id}:${from}`, // replay the session's history from its transcript
        onEvent: (ev) => current === sv && timelineEvent(ev),
        onState: (state, message) => {
          if (state === "gone" && current === sv) toast(message || "no such session", true);
        },
      }).start(),
      new EventStream(`/events?session=${enc}&type=text_delta,stream_reset`, {
        resume: false,
        onEvent: (ev) => {
          // Its own stream: deltas may come after the turn's end on the other one; only the open turn's.
          if (current !== sv || !sv.openTurn || sv.openTurn.turnId !== ev.turn_id) return;
          if (ev.type === "stream_reset") {
            // the attempt that streamed since the step's start failed and is retried: its text is void
            sv.reply = "";
            schedule(renderReply);
            return;
          }
          sv.reply += ev.delta;
          if (sv.reply.length > 4000) sv.reply = sv.reply.slice(-2000);
          schedule(renderReply);
        },
      }).start(),
    );
    refreshContext(0);
    refreshMessages(0);
  }

  function closeSession() {
    if (!sv) return;
    for (const stream of sv.streams) stream.close();
    for (const timer of Object.values(sv.timers)) clearTimeout(timer.id);
    sv = null;
  }

  // Run fn once after `delay` ms; asked again meanwhile, it still runs once, at the earlier time.
  function later(name, delay, fn) {
    if (!sv) return;
    const current = sv;
    const due = performance.now() + delay;
    const pending = sv.timers[name];
    if (pending) {
      if (pending.due <= due) return;
      clearTimeout(pending.id);
    }
    const id = setTimeout(() => {
      delete current.timers[name];
      if (current === sv) fn();
    }, delay);
    sv.timers[name] = { id, due };
  }

  function refreshContext(delay = 600) {
    later("context", delay, async () => {
      const current = sv;
      try {
        const ctx = await api("GET", `/sessions/${encodeURIComponent(current.id)}/context`);
        if (current === sv) {
          sv.context = ctx;
          schedule(renderContext);
        }
      } catch (err) {
        if (current === sv && err.status !== 401) $("ctx-caption").textContent = err.message;
      }
    });
  }

  function refreshMessages(delay = 500) {
    later("messages", delay, async () => {
      const current = sv;
      const base = `/sessions/${encodeURIComponent(current.id)}/messages?view=`;
      try {
        // the newest page only: older history is read back from the log on the server (design §2.2)
        const [user, model] = await Promise.all([
          api("GET", base + `user&limit=${MESSAGES_LIMIT}`),
          api("GET", base + "model"),
        ]);
        if (current === sv) {
          sv.messages = { user: user.messages, total: user.total ?? user.messages.length, model: model.messages };
          schedule(renderMessages);
        }
      } catch (err) {
        if (current === sv && err.status !== 401) $("msg-caption").textContent = err.message;
      }
    });
  }

  // The timeline: turns with their tool calls, compactions, overflow recoveries, errors, and notes.
  function addItem(item) {
    sv.items.push(item);
    sv.fresh.push(item);
    sv.dirty.add(item);
    if (sv.items.length > TIMELINE_LIMIT) {
      const old = sv.items.shift();
      if (old.el) old.el.remove();
      if (old.kind === "turn") sv.turns.delete(old.turnId);
      sv.trimmed = true;
    }
    return item;
  }
  function note(ev, kind, title, detail) {
    return addItem({ kind: "note", cls: kind, ts: ev.ts, title, detail, children: [] });
  }
  function child(ev, kind, label, text, extra) {
    const parent = (ev.turn_id && sv.turns.get(ev.turn_id)) || sv.openTurn;
    const entry = Object.assign({ kind, label, text, dur: "", ts: ev.ts }, extra || {});
    if (parent) {
      parent.children.push(entry);
      entry.parent = parent;
      sv.dirty.add(parent);
      return entry;
    }
    const item = addItem({ kind: "note", cls: kind, ts: ev.ts, title: label, detail: "", children: [entry] });
    entry.parent = item;
    return entry;
  }
  function touch(entry) {
    if (entry && entry.parent) sv.dirty.add(entry.parent);
  }

  function timelineEvent(ev) {
    stats.events += 1;
    switch (ev.type) {
      case "agent_start": {
        const turn = addItem({
          kind: "turn",
          turnId: ev.turn_id,
          ts: ev.ts,
          status: "running",
          children: [],
          requests: 0,
        });
        sv.turns.set(ev.turn_id, turn);
        sv.openTurn = turn;
        sv.reply = "";
        break;
      }
      case "request_start": {
        const turn = sv.turns.get(ev.turn_id);
        if (turn) {
          turn.requests = Math.max(turn.requests, ev.attempt); // the step's number within the turn
          sv.dirty.add(turn);
        }
        break;
      }
      case "agent_end": {
        const turn = sv.turns.get(ev.turn_id);
        if (turn) {
          turn.status = ev.status;
          turn.end = ev.ts;
          turn.usage = ev.usage;
          turn.context = ev.context_tokens;
          turn.window = ev.context_window;
          sv.dirty.add(turn);
        }
        if (sv.openTurn === turn) sv.openTurn = null;
        sv.reply = "";
        schedule(renderReply);
        refreshContext();
        refreshMessages();
        break;
      }
      case "tool_execution_start": {
        const entry = child(ev, "tool", ev.name, argsText(ev.arguments), { running: true, start: ev.ts });
        sv.calls.set(ev.call_id, entry);
        break;
      }
      case "tool_execution_end": {
        let entry = sv.calls.get(ev.call_id);
        if (!entry) entry = child(ev, "tool", ev.name, "", {});
        entry.running = false;
        entry.dur = duration(ev.duration);
        entry.failed = ev.is_error;
        entry.text =
          (entry.text ? entry.text + " → " : "") +
          `${int(ev.output_chars)} chars` +
          (ev.truncated ? " (truncated)" : "") +
          (ev.is_error ? " · error" : "");
        if (ev.is_error) entry.kind = "error";
        sv.calls.delete(ev.call_id);
        touch(entry);
        break;
      }
      case "compaction_start": {
        const label = ev.trigger === "overflow" ? "overflow" : "compaction";
        sv.compaction = child(
          ev,
          ev.trigger === "overflow" ? "overflow" : "compaction",
          label,
          `${triggerText(ev)}: compacting ${plural(ev.messages_before, "message")}, ${int(ev.tokens_before)} tokens…`,
          { running: true, start: ev.ts },
        );
        refreshContext();
        break;
      }
      case "compaction_end": {
        let entry = sv.compaction;
        if (!entry) entry = child(ev, "compaction", "compaction", "", {});
        entry.kind = ev.trigger === "overflow" ? "overflow" : "compaction";
        entry.label =
          ev.trigger !== "overflow" ? "compaction" : ev.cause === "counted" ? "emergency compaction" : "overflow recovery";
        entry.running = false;
        entry.dur = entry.start ? duration(ev.ts - entry.start) : "";
        entry.text =
          `${triggerText(ev)}: ${int(ev.tokens_before)} → ${int(ev.tokens_after)} tokens, ` +
          `${int(ev.messages_before)} → ${plural(ev.messages_after, "message")}, ${ev.mode}` +
          (ev.summary_chars ? `, summary ${int(ev.summary_chars)} chars` : "") +
          (ev.fallback ? " (fallback summary)" : "");
        entry.compaction = true;
        sv.compaction = null;
        touch(entry);
        sv.points.push({ ts: ev.ts, tokens: ev.tokens_before });
        sv.points.push({ ts: ev.ts, tokens: ev.tokens_after, compaction: ev });
        schedule(renderChart);
        refreshContext(200);
        refreshMessages(200);
        break;
      }
      case "compaction_failed": {
        const entry = sv.compaction || child(ev, "error", "compaction", "", {});
        entry.kind = "error";
        entry.label = "compaction failed";
        entry.running = false;
        entry.text = (ev.trigger ? `${triggerText(ev)}: ` : "") + ev.error;
        sv.compaction = null;
        touch(entry);
        break;
      }
      case "compaction_skipped": {
        // Nothing to reduce: no failure, the conversation is unchanged.
        const entry = sv.compaction || child(ev, "compaction", "compaction", "", {});
        entry.kind = "compaction";
        entry.label = "nothing to compact";
        entry.running = false;
        entry.text = ev.message;
        sv.compaction = null;
        touch(entry);
        break;
      }
      case "usage_overflow":
        child(ev, "overflow", "overflow", `provider counted ${int(ev.input_tokens)} tokens > window ${int(ev.context_window)}`);
        break;
      case "cache_break":
        note(
          ev,
          "note",
          "cache",
          `${int(ev.cached_tokens)} of ${int(ev.expected_tokens)} tokens read from the cache: ` +
            (CACHE_BREAKS[ev.cause] || ev.cause),
        );
        break;
      case "window_learned":
        note(ev, "note", "window", `${int(ev.new)} tokens (was ${int(ev.old)}), from the ${ev.source}`);
        refreshContext();
        break;
      case "provider_retry":
        child(ev, "overflow", "retry", `${ev.attempt}/${ev.max_attempts} in ${duration(ev.delay)}: ${clip(ev.error, 160)}`);
        break;
      case "stream_reset":
        child(ev, "overflow", "reset", `attempt ${ev.attempt} broke off mid-stream: its partial text was dropped`);
        break;
      case "stream_stalled":
        child(ev, "overflow", "stalled", `no data for ${duration(ev.seconds)}`);
        break;
      case "error":
        child(ev, "error", "error", `${ev.code}: ${ev.message}`);
        break;
      case "agent_abort":
        child(ev, "abort", "aborted", ev.repaired_calls ? `${ev.repaired_calls} tool call(s) answered with an error` : "turn stopped");
        break;
      case "message_queued":
        child(ev, "queue", ev.steer ? "steer" : "queued", ev.steer ? "steering message: joins at the next step" : `prompt queued at #${ev.position}`);
        break;
      case "tool_results_archived":
        child(ev, "compaction", "archived", `${plural(ev.archived, "old tool result")}, ${ev.strategy} summary`);
        refreshMessages();
        break;
      case "tool_outputs_cleared":
        child(ev, "compaction", "cleared", `${plural(ev.cleared, "old tool output")}, ${int(ev.tokens_freed)} tokens freed`);
        refreshMessages();
        break;
      case "approval_request":
        child(ev, "queue", "approval?", `${ev.name} ${argsText(ev.arguments)}`);
        break;
      case "status_update":
        sv.state = ev.state;
        schedule(renderSessionHead);
        break;
      case "usage_update":
        if (ev.context_tokens) sv.points.push({ ts: ev.ts, tokens: ev.context_tokens });
        schedule(renderChart);
        refreshContext();
        break;
      case "message_appended":
        if (ev.role === "assistant" && sv.reply) {
          sv.reply = ""; // the step's text is in the messages now
          schedule(renderReply);
        }
        refreshMessages();
        break;
      case "session_started":
        note(ev, "note", ev.resumed ? "resumed" : "started", `${ev.model}, window ${int(ev.context_window)}`);
        break;
      case "session_hibernated":
        note(ev, "note", "parked", "actors stopped; the next use starts them from the log");
        break;
      case "session_stopped":
        note(ev, "note", "stopped", ev.reason);
        break;
      case "session_dead":
        note(ev, "error", "dead", ev.message);
        break;
      case "model_changed":
        note(ev, "note", "model", `${ev.model}, window ${int(ev.context_window)}`);
        refreshContext();
        break;
      case "branched":
        note(ev, "note", "branched", ev.leaf_id ? `to ${ev.leaf_id}` : "to the start");
        refreshMessages();
        break;
      case "mcp_server_started":
        note(ev, "note", "MCP", `${ev.server} ready: ${(ev.tools || []).length} tools` + (ev.restarts ? ` (restart ${ev.restarts})` : ""));
        break;
      case "mcp_server_error":
        note(ev, "error", "MCP", `${ev.server} ${ev.kind}: ${ev.message}`);
        break;
      case "actor_restarted":
        note(ev, "error", "restarted", `${ev.actor} (${ev.restarts}): ${ev.error}`);
        break;
      case "agent_recovered":
        note(ev, "note", "recovered", plural(ev.messages, "message") + (ev.interrupted_turn ? ", an interrupted turn" : ""));
        break;
      case "log_recovered":
        note(ev, "error", "log repaired", `${ev.path}: ${int(ev.torn_bytes)} bytes cut`);
        break;
      case "persistence_error":
        note(ev, "error", "disk", `${ev.path}: ${ev.error}`);
        break;
      case "subscriber_lagged":
        note(ev, "error", "lagged", `${ev.dropped} events dropped by a slow stream`);
        break;
      default:
        return;
    }
    schedule(renderTimeline);
  }

  function argsText(raw) {
    if (!raw) return "";
    try {
      const parsed = JSON.parse(raw);
      if (parsed && typeof parsed === "object") {
        return clip(
          Object.entries(parsed)
            .map(([k, v]) => `${k}=${typeof v === "string" ? JSON.stringify(clip(v, 60)) : JSON.stringify(v)}`)
            .join(" "),
          200,
        );
      }
    } catch (_) {
      /* malformed arguments are shown as sent */
    }
    return clip(raw, 200);
  }

  function renderTimeline() {
    if (!sv) return;
    const box = $("timeline");
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const fragment = document.createDocumentFragment();
    for (const item of sv.fresh) {
      if (!sv.items.includes(item)) continue;
      item.el = el("div", { class: "tl-item" });
      fragment.append(item.el);
    }
    sv.fresh = [];
    box.append(fragment);
    for (const item of sv.dirty) if (item.el) renderItem(item);
    sv.dirty.clear();
    const turns = [...sv.turns.values()].length;
    $("tl-caption").textContent =
      `${turns} turn${turns === 1 ? "" : "s"}` + (sv.trimmed ? " (earlier events not shown)" : "");
    if (atBottom) box.scrollTop = box.scrollHeight;
  }

  function renderItem(item) {
    const t = now();
    let cls = "tl-item";
    let title;
    let detail;
    if (item.kind === "turn") {
      cls += " turn-" + item.status;
      title = item.status === "running" ? "turn · running" : `turn · ${item.status}`;
      const parts = [];
      const end = item.end || (item.status === "running" ? t : null);
      if (end) parts.push(duration(end - item.ts));
      if (item.requests) parts.push(`${item.requests} request${item.requests === 1 ? "" : "s"}`);
      const usage = item.usage || {};
      if (usage.input_tokens || usage.output_tokens)
        parts.push(`${int(usage.input_tokens || 0)} in / ${int(usage.output_tokens || 0)} out`);
      if (item.context) parts.push(`context ${int(item.context)} of ${int(item.window)}`);
      detail = parts.join(" · ");
    } else {
      cls += " note k-" + item.cls;
      title = item.title;
      detail = item.detail;
    }
    item.el.className = cls;
    item.el.dataset.kind = item.kind === "turn" ? "turn" : item.cls;
    if (item.kind === "turn") item.el.dataset.status = item.status;
    const head = el(
      "div",
      { class: "tl-head" },
      el("span", { class: "tl-time", text: clock(item.ts) }),
      el("span", { class: "tl-title", text: title }),
      el("span", { class: "tl-detail", text: detail || "" }),
    );
    const children = el("div", { class: "tl-children" });
    for (const entry of item.children) {
      children.append(
        el(
          "div",
          { class: "tl-child k-" + entry.kind, dataset: { kind: entry.kind, running: entry.running ? "1" : "" } },
          el("span", { class: "tl-kind", text: entry.label }),
          el("span", { class: "tl-text", text: entry.text, title: entry.text }),
          el("span", { class: "tl-dur", text: entry.running ? "running…" : entry.dur }),
        ),
      );
    }
    item.el.replaceChildren(head, item.children.length ? children : "");
  }

  function renderReply() {
    if (!sv) return;
    const node = $("live-reply");
    node.hidden = !sv.reply || !sv.openTurn;
    if (!node.hidden) {
      node.textContent = "assistant (streaming): " + sv.reply.slice(-1200);
      node.scrollTop = node.scrollHeight;
    }
  }

  const SEGMENTS = [
    ["system_prompt", "system prompt"],
    ["tools", "tools"],
    ["messages", "messages"],
    ["free", "free"],
    ["reserve", "reserve"],
  ];

  function renderContext() {
    if (!sv || !sv.context) return;
    const ctx = sv.context;
    const window = ctx.window || 0;
    const scale = Math.max(window, ctx.system_prompt + ctx.tools + ctx.messages + ctx.free + ctx.reserve, 1);
    const bar = $("ctx-bar");
    const segments = SEGMENTS.map(([key, label]) => {
      const value = ctx[key] || 0;
      return el("div", {
        class: "seg seg-" + key,
        style: { width: `${((100 * value) / scale).toFixed(3)}%` },
        title: `${label}: ${int(value)} tokens`,
        dataset: { part: key },
      });
    });
    if (ctx.compaction_threshold != null) {
      segments.push(
        el("div", {
          class: "threshold",
          style: { left: `${((100 * ctx.compaction_threshold) / scale).toFixed(3)}%` },
          title: `compaction threshold: ${int(ctx.compaction_threshold)} tokens`,
        }),
      );
    }
    bar.replaceChildren(...segments);
    bar.setAttribute("aria-label", `${int(ctx.total)} of ${int(window)} tokens`);
    const sources = ctx.sources || {};
    const legend = SEGMENTS.map(([key, label]) =>
      el(
        "span",
        { dataset: { part: key } },
        el("span", { class: "sw seg-" + key }),
        `${label} ${int(ctx[key])}`,
        sources[key]
          ? el("span", { class: "src", text: SOURCES[sources[key]] || sources[key], title: SOURCE_HINTS[sources[key]] })
          : null,
      ),
    );
    if (ctx.compaction_threshold != null)
      legend.push(el("span", null, el("span", { class: "sw threshold" }), `compacts at ${int(ctx.compaction_threshold)}`));
    $("ctx-legend").replaceChildren(...legend);
    const pct = window ? ((100 * ctx.total) / window).toFixed(0) : "–";
    $("ctx-caption").textContent =
      `${int(ctx.total)} of ${int(window)} tokens (${pct}%) · ${plural(ctx.message_count, "message")} · ` +
      (ctx.estimated ? "estimated" : SOURCES[sources.total] || sources.total || "actual") +
      (ctx.will_compact ? " · compacts on the next turn" : "");
  }

  // The context's size over time (one point per model call, a drop at each compaction), against the
  // compaction threshold and the window. An SVG drawn with attributes only (the page's CSP allows no
  // inline styles), stretched to the panel's width.
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS($("ctx-chart").namespaceURI, tag); // (the page's own svg element's)
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) if (c != null) node.append(c);
    return node;
  }
  function renderChart() {
    if (!sv) return;
    const points = sv.points;
    const row = table.rows.get(sv.id);
    const window = (row && row.window) || 0;
    const threshold = row && row.threshold;
    const chart = $("ctx-chart");
    if (points.length < 2) {
      chart.replaceChildren();
      $("chart-caption").textContent = points.length ? "" : "no model calls yet";
      return;
    }
    const W = 1000;
    const H = 100;
    const top = Math.max(window, ...points.map((p) => p.tokens), 1);
    const x = (i) => ((i / (points.length - 1)) * W).toFixed(1);
    const y = (tokens) => (H - (tokens / top) * H).toFixed(1);
    const parts = [];
    if (threshold)
      parts.push(
        svg("line", { class: "threshold", x1: 0, x2: W, y1: y(threshold), y2: y(threshold) }, svg("title", {}, `compacts at ${int(threshold)}`)),
      );
    parts.push(svg("polyline", { class: "line", points: points.map((p, i) => `${x(i)},${y(p.tokens)}`).join(" ") }));
    let compactions = 0;
    points.forEach((p, i) => {
      if (!p.compaction) return;
      compactions += 1;
      const c = p.compaction;
      parts.push(
        svg(
          "line",
          { class: "compaction", x1: x(i), x2: x(i), y1: 0, y2: H },
          svg("title", {}, `${clock(c.ts)} compaction ${triggerText(c)}: ${int(c.tokens_before)} → ${int(c.tokens_after)} tokens`),
        ),
      );
    });
    chart.replaceChildren(...parts);
    chart.dataset.compactions = String(compactions);
    chart.dataset.points = String(points.length);
    const peak = Math.max(...points.map((p) => p.tokens));
    $("chart-caption").textContent =
      `${plural(points.length, "point")} from ${clock(points[0].ts)} to ${clock(points[points.length - 1].ts)} · ` +
      `peak ${int(peak)} of ${int(window)} · ${plural(compactions, "compaction")} (violet)` +
      (threshold ? " · the dashed line is the compaction threshold" : "");
  }

  // The user view of the conversation, each message marked by how context management treats it.
  function renderMessages() {
    if (!sv || !sv.messages) return;
    const box = $("messages");
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const model = new Map(sv.messages.model.map((m) => [m.id, m]));
    const shown = sv.messages.user;
    const total = sv.messages.total;
    const nodes = shown.map((m) => messageNode(m, model));
    if (shown.length < total)
      nodes.unshift(el("div", { class: "tl-more", text: `${int(total - shown.length)} earlier messages not shown` }));
    box.replaceChildren(...nodes);
    const inContext = shown.filter((m) => model.has(m.id)).length;
    $("msg-caption").textContent = `${plural(total, "message")}, ${int(inContext)} in the model's context`;
    if (atBottom || !box.dataset.loaded) box.scrollTop = box.scrollHeight;
    box.dataset.loaded = "1";
  }

  function textOf(m) {
    return (m.parts || [])
      .filter((p) => p.type === "text")
      .map((p) => p.text)
      .join("");
  }

  function messageNode(m, model) {
    const seen = model.get(m.id);
    const tags = [];
    const kind = m.kind || "";
    const tag = (text, cls) => tags.push(el("span", { class: "tag " + cls, text }));
    if (kind === "compaction_summary") tag("compaction summary", "t-summary");
    if (kind === "tool_summary") tag("tool summary", "t-summary");
    if (kind === "steer") tag("steer", "t-context");
    if (kind === "turn_interrupted") tag("interrupted", "t-error");
    const modelKind = seen ? seen.kind || "" : kind;
    if (modelKind === "tool_result_archived" || modelKind === "tool_call_archived") tag("archived", "t-archived");
    if (modelKind === "tool_output_cleared") tag("output cleared", "t-cleared");
    const meta = (seen && seen.metadata) || m.metadata || {};
    if (meta.clipped) tag(`clipped from ${int(meta.clipped_from_chars)} chars`, "t-clipped");
    if (m.is_error) tag("error", "t-error");
    const outside = !seen && m.agent_visible !== false;
    if (!seen) tag(kind === "compaction_summary" ? "replaced" : "compacted away", "t-context");
    const head = el(
      "div",
      { class: "msg-head" },
      el("span", { class: "msg-role", text: m.role === "tool" ? "tool" + (m.name ? " · " + m.name : "") : m.role }),
      ...tags,
      el("span", { class: "muted", text: clock(m.created_at) }),
    );
    const text = textOf(m);
    const calls = (m.parts || []).filter((p) => p.type === "tool_call");
    const body = [];
    if (text) body.push(el("div", { class: "msg-body", text: clip(text, 6000) }));
    for (const call of calls) body.push(el("div", { class: "msg-calls", text: `→ ${call.name} ${argsText(call.arguments)}` }));
    const images = (m.parts || []).filter((p) => p.type === "image").length;
    if (images) body.push(el("div", { class: "muted", text: `${images} image(s)` }));
    return el(
      "div",
      {
        class: `msg r-${m.role}` + (kind ? " k-" + kind : "") + (outside ? " out-of-context" : ""),
        dataset: { id: m.id, kind, role: m.role, inContext: seen ? "1" : "0" },
      },
      head,
      ...body,
    );
  }

  function renderSessionHead() {
    if (!sv) return;
    const row = table.rows.get(sv.id);
    const state = sv.state && row && !row.compacting ? sv.state : row ? displayState(row) : sv.state || "…";
    const badge = $("s-state");
    badge.textContent = state;
    badge.className = "state s-" + state;
    if (row) {
      $("s-meta").textContent =
        `${row.model} · window ${int(row.window)} · ${int(row.input_tokens)} in / ${int(row.output_tokens)} out · ` +
        `${cost(row.cost)}${row.cost == null ? " (no price known)" : ""} · ${plural(row.compactions, "compaction")}` +
        (row.parent ? ` · sub-agent of ${row.parent}` : "");
      $("s-subtitle").textContent = row.title || "";
    }
    $("crumbs").textContent = "/ " + sv.id;
  }

  // -- actions --------------------------------------------------------------------------------------
  async function sendPrompt(event) {
    event.preventDefault();
    if (!sv) return;
    const text = $("prompt-text").value;
    if (!text.trim()) return;
    const steer = $("prompt-steer").checked;
    const button = $("prompt-send");
    button.disabled = true;
    $("prompt-status").textContent = "sending…";
    try {
      const result = await api("POST", `/sessions/${encodeURIComponent(sv.id)}/prompt`, { text, steer });
      $("prompt-text").value = "";
      $("prompt-status").textContent = (steer ? "steering message sent" : "sent") + ` (${result.prompt_id})`;
    } catch (err) {
      $("prompt-status").textContent = "";
      toast("The prompt was refused: " + err.message, true);
    } finally {
      button.disabled = false;
    }
  }

  async function abortTurn() {
    if (!sv) return;
    try {
      const result = await api("POST", `/sessions/${encodeURIComponent(sv.id)}/abort`);
      toast(result.aborted ? "Turn aborted" : "No turn was running");
    } catch (err) {
      toast("Abort failed: " + err.message, true);
    }
  }

  async function compactNow() {
    if (!sv) return;
    const button = $("s-compact");
    button.disabled = true;
    button.textContent = "Compacting…";
    try {
      const r = await api("POST", `/sessions/${encodeURIComponent(sv.id)}/compact`, {});
      toast(
        r.compacted
          ? `Compacted: ${int(r.tokens_before)} → ${int(r.tokens_after)} tokens`
          : `Nothing compacted${r.reason ? ": " + r.reason : ""}`,
      );
    } catch (err) {
      toast("Compaction failed: " + err.message, true);
    } finally {
      button.disabled = false;
      button.textContent = "Compact";
    }
  }

  async function createSession(event) {
    event.preventDefault();
    const body = {};
    const model = $("new-model").value.trim();
    const system = $("new-system").value;
    if (model) body.model = model;
    if (system.trim()) body.system_prompt = system;
    const button = $("new-create");
    button.disabled = true;
    try {
      const created = await api("POST", "/sessions", body);
      $("new-form").hidden = true;
      $("new-model").value = "";
      $("new-system").value = "";
      toast(`Session ${created.id} started (${created.model})`);
      requestOverview(0);
      location.hash = "#/s/" + encodeURIComponent(created.id);
    } catch (err) {
      toast("The session was refused: " + err.message, true);
    } finally {
      button.disabled = false;
    }
  }

  async function deleteSession() {
    if (!sv) return;
    const id = sv.id;
    if (!confirm(`Delete session ${id}? Its log and files are removed for good.`)) return;
    try {
      await api("DELETE", `/sessions/${encodeURIComponent(id)}`);
      table.rows.delete(id);
      table.orderDirty = true;
      schedule(renderCounts);
      toast(`Session ${id} deleted`);
      location.hash = "#/";
    } catch (err) {
      toast("Delete failed: " + err.message, true);
    }
  }

  // -- views and routing ----------------------------------------------------------------------------
  const view = { name: null };

  function show(name) {
    view.name = name;
    $("login").hidden = name !== "login";
    $("sessions-view").hidden = name !== "sessions";
    $("session-view").hidden = name !== "session";
    $("logout").hidden = name === "login";
  }

  function route() {
    if (!auth.token) {
      showLogin("");
      return;
    }
    const match = location.hash.match(/^#\/s\/(.+)$/);
    if (match) {
      const id = decodeURIComponent(match[1]);
      show("session");
      if (!sv || sv.id !== id) openSession(id);
      document.title = `${id} · agentcell`;
    } else {
      closeSession();
      show("sessions");
      $("crumbs").textContent = "";
      document.title = "agentcell";
      table.orderDirty = true;
      schedule(renderTable);
    }
  }

  let started = false;
  async function start() {
    route();
    if (started) return;
    started = true;
    if (!table.eventTypes) {
      // The stream's event types come with the first snapshot (every type but the deltas).
      try {
        ingestOverview(await api("GET", "/overview"));
      } catch (err) {
        started = false;
        if (err.status !== 401) showLogin("Cannot reach the server: " + err.message);
        return;
      }
    }
    startMainStream();
  }

  function unauthorized() {
    auth.clear();
    started = false;
    if (mainStream) mainStream.close();
    mainStream = null;
    closeSession();
    $("conn").dataset.state = "off";
    $("conn").textContent = "offline";
    showLogin("The server refused the token.");
  }

  function showLogin(message) {
    show("login");
    $("login-error").textContent = message;
    $("token").focus();
  }

  async function login(event) {
    event.preventDefault();
    const value = $("token").value.trim();
    if (!value) return;
    auth.set(value);
    try {
      const snapshot = await api("GET", "/overview");
      $("token").value = "";
      ingestOverview(snapshot);
      start();
    } catch (err) {
      if (err.status !== 401) {
        auth.clear();
        showLogin("Cannot reach the server: " + err.message);
      }
    }
  }

  function setup() {
    $("login-form").addEventListener("submit", login);
    $("logout").addEventListener("click", () => {
      auth.clear();
      location.hash = "";
      location.reload();
    });
    $("filter").addEventListener("input", (e) => {
      table.filter = e.target.value.trim().toLowerCase();
      table.orderDirty = true;
      schedule(renderTable);
    });
    $("state-filter").addEventListener("change", (e) => {
      table.stateFilter = e.target.value;
      table.orderDirty = true;
      schedule(renderTable);
    });
    $("sessions").tHead.addEventListener("click", (e) => {
      const th = e.target.closest("th");
      if (!th) return;
      const key = th.dataset.key;
      if (table.sortKey === key) table.sortDir = -table.sortDir;
      else {
        table.sortKey = key;
        table.sortDir = key === "id" || key === "model" || key === "state" ? 1 : -1;
      }
      table.orderDirty = true;
      schedule(renderTable);
    });
    $("rows").addEventListener("click", (e) => {
      const tr = e.target.closest("tr.row");
      if (tr && tr.dataset.id) location.hash = "#/s/" + encodeURIComponent(tr.dataset.id);
    });
    $("table-wrap").addEventListener("scroll", () => schedule(renderTable), { passive: true });
    window.addEventListener("resize", () => schedule(renderTable));
    window.addEventListener("hashchange", route);
    $("prompt-form").addEventListener("submit", sendPrompt);
    $("prompt-text").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("prompt-form").requestSubmit();
    });
    $("s-abort").addEventListener("click", abortTurn);
    $("s-delete").addEventListener("click", deleteSession);
    $("new-session").addEventListener("click", () => {
      $("new-form").hidden = !$("new-form").hidden;
      if (!$("new-form").hidden) $("new-model").focus();
    });
    $("new-form").addEventListener("submit", createSession);
    $("new-cancel").addEventListener("click", () => ($("new-form").hidden = true));
    $("s-compact").addEventListener("click", compactNow);
    // Ages and "running…" durations move with the clock: redraw what is on screen once a second.
    setInterval(() => {
      if (view.name === "sessions") schedule(renderTable);
      if (view.name === "session" && sv && sv.openTurn) {
        sv.dirty.add(sv.openTurn);
        schedule(renderTimeline);
      }
    }, 1000);
    if (auth.token) start();
    else showLogin("");
  }

  // For the curious and for the browser test: counters, and the two ways data comes in.
  window.agentcell = { stats, ingestOverview, ingestEvents, table };

  setup();
})();
