// jobq dashboard: reads the JSON API and acts through it. Every value from the API reaches the page as a
// text node (el() and textContent), never parsed as markup: the server's Content-Security-Policy enforces
// Trusted Types, so handing a string to an HTML sink would throw rather than parse a job's payload or error.
"use strict";

(() => {
  const KEY_STORE = "jobq.apiKey"; // sessionStorage: this tab only, gone when it closes
  const REFRESH_MS = 3000; // the automatic refresh while the tab is shown and the server answers quickly
  const REFRESH_MAX_MS = 60_000; // its longest pause, after failures or slow answers
  const PAGE_SIZE = 50;
  const SLOW_PANELS_MS = 15_000; // schedules and sparklines change by the minute: fetched at most this often
  const STATUSES = ["pending", "waiting", "running", "completed", "failed", "cancelled"];

  // --- DOM helpers -------------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else if (name === "class") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const $ = (id) => document.getElementById(id);
  const none = () => el("span", { class: "muted" }, "—");

  function fmtTime(iso) {
    if (!iso) return none();
    const d = new Date(iso);
    return el("time", { datetime: iso, title: iso }, Number.isNaN(d.getTime()) ? iso : d.toLocaleString());
  }

  function fmtAge(seconds) {
    if (seconds === null || seconds === undefined) return none();
    if (seconds < 60) return `${seconds.toFixed(1)} s`;
    if (seconds < 3600) return `${(seconds / 60).toFixed(1)} min`;
    if (seconds < 86400) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  function fmtMs(ms) {
    if (ms === null || ms === undefined) return none();
    return ms < 1000 ? `${ms.toFixed(1)} ms` : `${(ms / 1000).toFixed(2)} s`;
  }

  const fmtJson = (value) => (value === null || value === undefined ? "null" : JSON.stringify(value, null, 2));
  const badge = (text, kind) => el("span", { class: `badge ${kind || text}` }, text);
  const queueHref = (queue, status) =>
    `#/queues/${encodeURIComponent(queue)}${status ? `?status=${encodeURIComponent(status)}` : ""}`;
  const jobHref = (id) => `#/jobs/${encodeURIComponent(id)}`;

  function kvTable(rows, label) {
    return el(
      "table",
      { class: "kv", "aria-label": label },
      el("caption", {}, label),
      rows.map(([name, value]) => el("tr", {}, el("th", { scope: "row" }, name), el("td", { class: "num" }, value))),
    );
  }

  function fmtCount(n) {
    if (n === null || n === undefined) return "—";
    const abs = Math.abs(n);
    if (abs >= 1e6) return `${(n / 1e6).toFixed(abs >= 1e7 ? 0 : 1)}M`;
    if (abs >= 1e3) return `${(n / 1e3).toFixed(abs >= 1e4 ? 0 : 1)}k`;
    return Number.isInteger(n) ? String(n) : n.toFixed(1);
  }

  // Live counts past JOBQ_STATS_EXACT_MAX are the background's count (counts_estimated): shown with "≈".
  const LIVE = new Set(["ready", "scheduled", "pending", "waiting", "running"]);
  const liveCount = (doc, name) => (doc.counts_estimated && LIVE.has(name) ? `≈${doc.counts[name]}` : doc.counts[name]);

  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  // --- charts: plain SVG built here, coloured by app.css (no inline style, no markup parsed) -----------------

  const SVG_NS = "http://www.w3.org/2000/svg";

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const RANGES = { hour: "last hour", day: "last day", week: "last week" };
  const BY = { hour: "by the minute", day: "by 15 minutes", week: "by the hour" };
  const PER = { hour: "per minute", day: "per 15 minutes", week: "per hour" };
  // Each chart: its lines (a field of the series' points, and the class that colours it) and its units.
  const CHARTS = [
    { id: "throughput", title: "Throughput", unit: "jobs", format: fmtCount,
      lines: [["enqueued", "enqueued"], ["completed", "completed"], ["failed", "failed"]] },
    { id: "durations", title: "Claim to completion", unit: "p50 and p95", format: (v) => (v === null ? "—" : fmtMs(v)),
      lines: [["p50_ms", "p50"], ["p95_ms", "p95"]] },
    { id: "backlog", title: "Ready backlog", unit: "ready jobs", format: fmtCount, lines: [["ready", "ready"]] },
    { id: "oldest", title: "Oldest ready job", unit: "waiting for", format: (v) => (v === null ? "—" : fmtAge(v)),
      lines: [["oldest_ready_age_seconds", "oldest"]] },
  ];
  const W = 320;
  const H = 130;
  const PAD = { left: 4, right: 4, top: 14, bottom: 16 };

  // The top of a chart's scale: the largest value rounded up to 1, 2, 2.5 or 5 times a power of ten.
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(v));
    return power * [1, 2, 2.5, 5, 10].find((m) => m * power >= v);
  }

  function bucketLabel(iso, range) {
    const d = new Date(iso);
    return range === "week"
      ? d.toLocaleString([], { weekday: "short", hour: "2-digit", minute: "2-digit" })
      : d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  // One line per series: a vertex per bucket that has a value ("M" starts a run after a gap, "L" continues
  // it; a lone vertex gets a zero-length segment, which the round line caps draw as a dot).
  function linePath(values, x, y) {
    let d = "";
    values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const joined = i > 0 && values[i - 1] !== null && values[i - 1] !== undefined;
      d += `${joined ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
      const next = values[i + 1];
      if (!joined && (next === null || next === undefined)) d += "h0";
    });
    return d;
  }

  function drawChart(spec, doc) {
    const points = doc.points;
    const n = points.length;
    const values = spec.lines.map(([key]) => points.map((p) => p[key]));
    const max = niceCeil(Math.max(0, ...values.flat().filter((v) => v !== null && v !== undefined)));
    const x = (i) => PAD.left + (n <= 1 ? 0 : (i * (W - PAD.left - PAD.right)) / (n - 1));
    const y = (v) => PAD.top + (H - PAD.top - PAD.bottom) * (1 - v / max);
    const guide = svg("line", { class: "guide", x1: 0, x2: 0, y1: PAD.top, y2: H - PAD.bottom, visibility: "hidden" });
    const legend = el("div", { class: "legend" });
    const when = el("span", { class: "muted when" });

    function show(i) {
      const at = i === null ? n - 1 : i;
      when.textContent = i === null ? "latest" : bucketLabel(points[at].at, doc.range);
      legend.replaceChildren(
        ...spec.lines.map(([key, cls]) =>
          el("span", { class: "item", "data-series": key }, el("span", { class: `swatch ${cls}` }), `${cls} `,
            el("strong", {}, spec.format(points[at][key]))),
        ),
        when,
      );
      guide.setAttribute("visibility", i === null ? "hidden" : "visible");
      if (i !== null) {
        guide.setAttribute("x1", x(i).toFixed(1));
        guide.setAttribute("x2", x(i).toFixed(1));
      }
    }

    function hover(event) {
      const box = event.currentTarget.getBoundingClientRect();
      const vx = ((event.clientX - box.left) / box.width) * W;
      const i = Math.round(((vx - PAD.left) / (W - PAD.left - PAD.right)) * (n - 1));
      show(Math.min(n - 1, Math.max(0, i)));
    }

    const grid = [0, 0.5, 1].map((f) => {
      const gy = y(max * f);
      return [
        svg("line", { class: "grid", x1: PAD.left, x2: W - PAD.right, y1: gy.toFixed(1), y2: gy.toFixed(1) }),
        f > 0 ? svg("text", { class: "tick", x: PAD.left + 2, y: (gy - 3).toFixed(1) }, spec.format(max * f)) : null,
      ];
    });
    const chart = svg(
      "svg",
      { class: "chart", id: `chart-${spec.id}`, viewBox: `0 0 ${W} ${H}`, role: "img",
        "aria-label": `${spec.title}, ${RANGES[doc.range]}`, "data-buckets": n,
        onpointermove: hover, onpointerleave: () => show(null) },
      svg("title", {}, `${spec.title} (${spec.unit}), ${RANGES[doc.range]}, ${BY[doc.range]}`),
      grid,
      spec.lines.map(([key, cls], k) =>
        svg("path", { class: `series ${cls}`, "data-series": key, d: linePath(values[k], x, y) }),
      ),
      guide,
      svg("text", { class: "tick", x: PAD.left, y: H - 4 }, bucketLabel(points[0].at, doc.range)),
      svg("text", { class: "tick end", x: W - PAD.right, y: H - 4 }, "now"),
    );
    show(null);
    const unit = spec.id === "throughput" ? `${spec.unit} ${PER[doc.range]}` : spec.unit;
    return el("figure", { class: "chart-box", "data-chart": spec.id },
      el("figcaption", {}, el("strong", {}, spec.title), ` ${unit}`), chart, legend);
  }

  // A chart panel over a series endpoint: range buttons, four charts, reloaded at most every 15 s (an hour
  // by the minute) or minute (a day, a week), and at once when the range changes.
  function chartsPanel(label, pathFor) {
    let range = "hour";
    let fetched = 0;
    let fetchedRange = null;
    let last = "";
    const grid = el("div", { class: "chart-grid" });
    const buttons = Object.entries(RANGES).map(([r, text]) =>
      el("button", { type: "button", "data-range": r, "aria-pressed": String(r === range) }, text),
    );
    const node = el(
      "section",
      { class: "charts", "aria-label": label },
      el("div", { class: "toolbar tabs", role: "group", "aria-label": "Range" }, el("strong", {}, label), buttons),
      grid,
    );

    async function load(force) {
      const fresh = Date.now() - fetched < (range === "hour" ? 15_000 : 60_000);
      if (!force && fetchedRange === range && fresh) return;
      const doc = await api("GET", pathFor(range));
      fetched = Date.now();
      fetchedRange = range;
      const text = JSON.stringify(doc.points);
      if (text === last) return;
      last = text;
      grid.replaceChildren(...CHARTS.map((spec) => drawChart(spec, doc)));
    }

    for (const button of buttons) {
      button.addEventListener("click", async () => {
        range = button.dataset.range;
        for (const b of buttons) b.setAttribute("aria-pressed", String(b === button));
        try {
          await load(true);
        } catch (err) {
          loadFailed(err);
        }
      });
    }
    return { node, load };
  }

  function sparkline(line) {
    const w = 120;
    const h = 24;
    const completed = line ? line.completed : [0];
    const failed = line ? line.failed : [0];
    const n = completed.length;
    const max = Math.max(1, ...completed, ...failed);
    const x = (i) => (n <= 1 ? 0 : (i * w) / (n - 1));
    const y = (v) => 2 + (h - 4) * (1 - v / max);
    const sum = (a) => (a || []).reduce((t, v) => t + v, 0);
    const text = line
      ? `last hour: ${sum(line.enqueued)} enqueued, ${sum(completed)} completed, ${sum(failed)} failed`
      : "last hour: no activity";
    return svg(
      "svg",
      { class: "sparkline", viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": text },
      svg("title", {}, text),
      svg("path", { class: "series completed", "data-series": "completed", d: linePath(completed, x, y) }),
      sum(failed) ? svg("path", { class: "series failed", "data-series": "failed", d: linePath(failed, x, y) }) : null,
    );
  }

  // --- the API -----------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem) {
      const detail = (problem && (problem.detail || problem.title)) || `HTTP ${status}`;
      super(detail);
      this.status = status;
      this.problem = problem;
    }
  }

  // Relative paths: the API lives beside /ui, also behind a proxy that mounts jobq under a prefix.
  async function api(method, path, body) {
    const headers = { accept: "application/json" };
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.authorization = `Bearer ${key}`;
    const init = { method, headers, cache: "no-store", credentials: "omit", redirect: "error" };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, { detail: `jobq did not answer (${err.message}).` });
    }
    const text = await response.text();
    let doc = null;
    try {
      doc = text ? JSON.parse(text) : null;
    } catch {
      doc = null;
    }
    if (!response.ok) throw new ApiError(response.status, doc);
    return doc;
  }

  const q = (queue) => `queues/${encodeURIComponent(queue)}`;

  // --- messages, key entry -----------------------------------------------------------------------------------

  let bannerKind = null; // "load": cleared by the next good load; "action": stays until the next action

  function banner(text, kind, tone) {
    const node = $("banner");
    node.textContent = text;
    node.className = tone === "info" ? "info" : "";
    node.hidden = !text;
    bannerKind = text ? kind : null;
  }

  function describe(err) {
    if (!(err instanceof ApiError)) return `Unexpected error: ${err.message}`;
    if (err.status === 0) return err.message;
    if (err.status === 401) return `Not signed in: ${err.message}`;
    if (err.status === 403) return `Forbidden: ${err.message} The dashboard needs an admin key for these queues.`;
    const title = (err.problem && err.problem.title) || "Error";
    return `${title} (${err.status}): ${err.message}`;
  }

  function showLogin(message) {
    $("login").hidden = false;
    $("login-message").textContent = message;
    $("key-input").focus();
  }

  function syncKeyButton() {
    $("forget-key").hidden = !sessionStorage.getItem(KEY_STORE);
  }

  // A failed load: 401 asks for a key, 403 says what the key lacks and offers another one.
  function loadFailed(err) {
    if (err instanceof ApiError && err.status === 401) {
      if (sessionStorage.getItem(KEY_STORE)) {
        sessionStorage.removeItem(KEY_STORE);
        showLogin(`That key was refused: ${err.message}`);
      } else {
        showLogin(`This jobq requires an API key: ${err.message}`);
      }
      syncKeyButton();
      banner("", null);
      $("view").replaceChildren(el("p", { class: "muted" }, "Enter an admin API key to see the queues."));
      return;
    }
    if (err instanceof ApiError && err.status === 403) {
      showLogin("This key lacks the admin scope (or may not use this queue): enter an admin key.");
    }
    banner(describe(err), "load");
  }

  // An action: its outcome (or the problem's detail when refused) stays on screen.
  async function act(button, run, done) {
    button.disabled = true;
    try {
      const outcome = await run();
      banner(done(outcome), "action", "info");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) loadFailed(err);
      else banner(describe(err), "action");
    } finally {
      button.disabled = false;
    }
    await refresh();
  }

  function confirmInline(panel, text, confirmLabel, onConfirm) {
    const yes = el("button", { type: "button", class: "confirm" }, confirmLabel);
    const no = el("button", { type: "button" }, "Never mind");
    yes.addEventListener("click", async () => {
      panel.hidden = true;
      await onConfirm(yes);
    });
    no.addEventListener("click", () => {
      panel.hidden = true;
    });
    panel.replaceChildren(el("p", {}, text), el("div", { class: "toolbar" }, yes, no));
    panel.hidden = false;
  }

  // --- shared pieces of the views ----------------------------------------------------------------------------

  // A table of jobs whose rows can be selected, and the bulk actions on the selection: a dry run first
  // (what would change, what would be skipped), then the real thing once confirmed. The selection survives
  // refreshes and pages; `onDone` runs after an action.
  function selectableJobs(tableId, panel, onDone) {
    const selected = new Set();
    const count = el("span", { class: "muted", id: `${tableId}-selected` });
    const cancel = el("button", { type: "button", class: "bulk", "data-action": "cancel" }, "Cancel selected…");
    const retry = el("button", { type: "button", class: "bulk", "data-action": "retry" }, "Retry selected…");
    const holder = el("div");
    let boxes = [];
    let all = null;

    function sync() {
      count.textContent = selected.size ? `${plural(selected.size, "job")} selected` : "";
      cancel.disabled = retry.disabled = selected.size === 0;
      for (const box of boxes) box.checked = selected.has(box.value);
      if (all) all.checked = boxes.length > 0 && boxes.every((b) => b.checked);
    }

    async function bulk(button) {
      const action = button.dataset.action;
      const ids = [...selected].map(Number);
      button.disabled = true;
      try {
        const dry = await api("POST", "jobs/bulk", { action, ids, dry_run: true });
        const verb = action === "cancel" ? "cancelled" : "retried";
        const skipped = dry.skipped ? `; ${dry.skipped} skipped (${action === "cancel"
          ? "already finished" : "not failed or cancelled"})` : "";
        const missing = dry.not_found ? `; ${dry.not_found} no longer exist` : "";
        if (!dry.done) {
          confirmInline(panel, `None of the selected jobs can be ${verb}${skipped}${missing}.`, "OK", async () => {});
          return;
        }
        confirmInline(
          panel,
          `${plural(dry.done, "job")} would be ${verb}${skipped}${missing}.`,
          `${action === "cancel" ? "Cancel" : "Retry"} ${plural(dry.done, "job")}`,
          (yes) =>
            act(
              yes,
              async () => {
                const done = await api("POST", "jobs/bulk", { action, ids });
                selected.clear();
                onDone();
                return done;
              },
              (r) => `${plural(r.done, "job")} ${verb}${r.skipped ? `; ${r.skipped} skipped` : ""}.`,
            ),
        );
      } catch (err) {
        banner(describe(err), "action");
      } finally {
        button.disabled = false;
        sync();
      }
    }
    cancel.addEventListener("click", () => bulk(cancel));
    retry.addEventListener("click", () => bulk(retry));

    function render(jobs, empty) {
      if (!jobs.length) {
        boxes = [];
        all = null;
        holder.replaceChildren(el("p", { class: "muted" }, empty));
        sync();
        return;
      }
      const pick = (ids, on) => {
        for (const id of ids) {
          if (on) selected.add(id);
          else selected.delete(id);
        }
        sync();
      };
      boxes = jobs.map((job) =>
        el("input", { type: "checkbox", value: String(job.id), "aria-label": `Select job ${job.id}`,
          onchange: (e) => pick([e.target.value], e.target.checked) }),
      );
      all = el("input", { type: "checkbox", "aria-label": "Select every job on this page",
        onchange: (e) => pick(boxes.map((b) => b.value), e.target.checked) });
      holder.replaceChildren(
        el(
          "table",
          { id: tableId },
          el("thead", {}, el("tr", {}, el("th", {}, all), ["id", "queue", "status", "attempts", "priority", "run at",
            "created", "finished", "last error"].map((h) => el("th", {}, h)))),
          el(
            "tbody",
            {},
            jobs.map((job, i) =>
              el(
                "tr",
                { "data-job": job.id },
                el("td", {}, boxes[i]),
                el("td", {}, el("a", { href: jobHref(job.id) }, job.id)),
                el("td", {}, el("a", { href: queueHref(job.queue) }, job.queue)),
                el("td", {}, badge(job.status)),
                el("td", { class: "num" }, `${job.attempts}/${job.max_attempts}`),
                el("td", { class: "num" }, job.priority),
                el("td", {}, fmtTime(job.run_at)),
                el("td", {}, fmtTime(job.created_at)),
                el("td", {}, fmtTime(job.finished_at)),
                el("td", { class: "error" }, job.last_error === null ? none() : job.last_error.slice(0, 200)),
              ),
            ),
          ),
        ),
      );
      sync();
    }

    sync();
    return { toolbar: el("div", { class: "toolbar" }, cancel, retry, count), holder, render };
  }

  // Enqueue a job from the dashboard: queue, JSON payload, priority, delay. The payload is parsed here so
  // that a typo is pointed out before anything is sent; the API checks everything else.
  function enqueueForm(queue) {
    const form = el("form", { class: "panel enqueue", id: "enqueue-form", hidden: true,
      "aria-label": "Enqueue a job" });
    const field = (label, input) => el("label", {}, el("span", {}, label), input);
    const queueInput = el("input", { name: "queue", required: true, pattern: "[A-Za-z0-9_.:\\-]{1,128}",
      spellcheck: "false", value: queue || "" });
    const payload = el("textarea", { name: "payload", rows: 4, spellcheck: "false" });
    payload.value = "{}";
    const priority = el("input", { name: "priority", type: "number", step: 1, min: -32768, max: 32767, value: 0 });
    const delay = el("input", { name: "delay", type: "number", step: "any", min: 0, placeholder: "0" });
    const submit = el("button", { type: "submit" }, "Enqueue");
    const close = el("button", { type: "button" }, "Close");
    const open = el("button", { type: "button", id: "enqueue-open" }, "Enqueue a job…");
    form.append(
      ...(queue ? [] : [field("Queue", queueInput)]),
      field("Payload (JSON)", payload),
      field("Priority", priority),
      field("Delay (seconds)", delay),
      el("div", { class: "toolbar" }, submit, close),
    );
    open.addEventListener("click", () => {
      form.hidden = false;
      (queue ? payload : queueInput).focus();
    });
    close.addEventListener("click", () => {
      form.hidden = true;
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      let value;
      try {
        value = JSON.parse(payload.value);
      } catch (err) {
        banner(`The payload is not valid JSON: ${err.message}`, "action");
        payload.focus();
        return;
      }
      const target = queue || queueInput.value.trim();
      const body = { payload: value, priority: Number(priority.value || 0) };
      if (delay.value !== "") body.delay_seconds = Number(delay.value);
      act(submit, () => api("POST", `${q(target)}/jobs`, body), (job) => `Job ${job.id} enqueued on ${job.queue}.`);
    });
    return { open, form };
  }

  // --- schedules: next run times (a panel of the queues view) ------------------------------------------------

  // The schedules the key may see, each with its next run; built once, refilled on every refresh.
  function schedulesPanel() {
    const body = el("div", { id: "schedules-panel" });
    let last = "";
    const cols = ["Schedule", "Queue", "Cron", "Time zone", "Next run", "Last run", "State"];
    let fetched = 0;
    return {
      node: el("section", { "aria-label": "Schedules" }, el("h2", {}, "Schedules"), body),
      async load() {
        if (Date.now() - fetched < SLOW_PANELS_MS) return;
        const doc = await api("GET", "schedules");
        fetched = Date.now();
        const text = JSON.stringify(doc);
        if (text === last) return;
        last = text;
        if (!doc.schedules.length) {
          const how = "No schedules: PUT /schedules/{name} (or `jobq schedules put`) makes one.";
          body.replaceChildren(el("p", { class: "muted" }, how));
          return;
        }
        body.replaceChildren(
          el(
            "table",
            { id: "schedules" },
            el("thead", {}, el("tr", {}, cols.map((c) => el("th", {}, c)))),
            el(
              "tbody",
              {},
              doc.schedules.map((s) =>
                el(
                  "tr",
                  { "data-schedule": s.name },
                  el("td", {}, s.name),
                  el("td", {}, el("a", { href: queueHref(s.queue) }, s.queue)),
                  el("td", {}, el("code", {}, s.cron)),
                  el("td", {}, s.timezone),
                  el("td", { "data-col": "next" }, fmtTime(s.next_run_at)),
                  el("td", { "data-col": "last" }, fmtTime(s.last_run_at)),
                  el("td", { "data-col": "state" }, s.paused ? badge("paused") : badge("active")),
                ),
              ),
            ),
          ),
        );
      },
    };
  }

  // --- views -------------------------------------------------------------------------------------------------
  // Each view builds its frame once (mount) and fills it on every refresh (load), so that panels and
  // buttons the operator is using survive the automatic refresh.

  function queuesView() {
    const body = el("div");
    const charts = chartsPanel("All queues", (range) => `stats/series?range=${range}`);
    const enqueue = enqueueForm(null);
    const schedules = schedulesPanel();
    // A page of queues at a time, and the sparklines of that page only (the API's GET /queues and
    // /stats/sparklines page and bound both): a service with thousands of queues costs a page per refresh.
    const prev = el("button", { type: "button", id: "queues-prev" }, "Previous queues");
    const next = el("button", { type: "button", id: "queues-next" }, "Next queues");
    const cursors = []; // cursors of the pages before this one ("" for the first)
    let cursor = "";
    let nextCursor = null;
    let lines = new Map();
    let linesAt = 0;
    let linesFor = "";
    let last = "";
    prev.addEventListener("click", () => {
      cursor = cursors.pop() || "";
      refresh();
    });
    next.addEventListener("click", () => {
      if (nextCursor === null) return;
      cursors.push(cursor);
      cursor = nextCursor;
      refresh();
    });
    return {
      mount(root) {
        root.replaceChildren(
          el("h2", {}, "Queues"),
          el("div", { class: "toolbar" }, enqueue.open, el("a", { href: "#/search" }, "Search jobs…")),
          enqueue.form,
          body,
          el("div", { class: "toolbar" }, prev, next),
          charts.node,
          schedules.node,
        );
      },
      async load() {
        await Promise.all([this.loadQueues(), schedules.load()]);
      },
      async loadQueues() {
        const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
        if (cursor) params.set("cursor", cursor);
        const [doc] = await Promise.all([api("GET", `queues?${params}`), charts.load(false)]);
        nextCursor = doc.next_cursor;
        next.disabled = nextCursor === null;
        prev.disabled = cursor === "";
        const names = doc.queues.map((item) => item.queue);
        const shown = names.join("\n");
        if (names.length && (shown !== linesFor || Date.now() - linesAt >= SLOW_PANELS_MS)) {
          const asked = new URLSearchParams({ range: "hour", limit: String(PAGE_SIZE) });
          for (const name of names) asked.append("queue", name);
          const sparks = await api("GET", `stats/sparklines?${asked}`);
          lines = new Map(sparks.queues.map((line) => [line.queue, line]));
          linesAt = Date.now();
          linesFor = shown;
        }
        const text = JSON.stringify([doc, [...lines.values()]]);
        if (text === last) return;
        last = text;
        if (!doc.queues.length) {
          const none = cursor ? "No more queues." : "No queues yet: a queue appears with its first job.";
          body.replaceChildren(el("p", { class: "muted" }, none));
          return;
        }
        const cols = ["ready", "scheduled", "waiting", "running", "completed", "failed", "cancelled"];
        body.replaceChildren(
          el(
            "table",
            { id: "queues" },
            el(
              "thead",
              {},
              el("tr", {}, el("th", {}, "Queue"), el("th", {}, "State"), el("th", {}, "Completed, last hour"),
                cols.map((c) => el("th", { class: "num" }, c)), el("th", { class: "num" }, "oldest ready")),
            ),
            el(
              "tbody",
              {},
              doc.queues.map((item) =>
                el(
                  "tr",
                  { "data-queue": item.queue },
                  el("td", {}, el("a", { href: queueHref(item.queue) }, item.queue)),
                  el("td", { "data-col": "state" }, item.paused ? badge("paused") : badge("active")),
                  el("td", { "data-col": "sparkline" }, sparkline(lines.get(item.queue))),
                  cols.map((c) => el("td", { class: "num", "data-col": c }, liveCount(item, c))),
                  el("td", { class: "num", "data-col": "oldest" }, fmtAge(item.oldest_ready_age_seconds)),
                ),
              ),
            ),
          ),
        );
      },
    };
  }

  function queueView(queue, status) {
    const state = el("span");
    const pause = el("button", { type: "button", id: "pause" }, "Pause");
    const redrive = el("button", { type: "button", id: "redrive" }, "Redrive failed jobs…");
    const panel = el("div", { class: "panel", id: "confirm", hidden: true });
    const stats = el("div", { class: "grid", id: "stats" });
    const config = queueConfigPanel(queue);
    const charts = chartsPanel(`History of ${queue}`, (range) => `${q(queue)}/stats/series?range=${range}`);
    const enqueue = enqueueForm(queue);
    let lastJobs = "";
    const jobs = selectableJobs("job-list", panel, () => {
      lastJobs = "";
    });
    const prev = el("button", { type: "button", id: "prev-page" }, "Previous page");
    const next = el("button", { type: "button", id: "next-page" }, "Next page");
    const cursors = []; // cursors of the pages before this one ("" for the first)
    let cursor = "";
    let nextCursor = null;
    let paused = null;

    pause.addEventListener("click", () =>
      act(
        pause,
        () => api("POST", `${q(queue)}/${paused ? "resume" : "pause"}`),
        (r) => `Queue ${r.queue} ${r.paused ? "paused: claims return empty" : "resumed"}.`,
      ),
    );
    redrive.addEventListener("click", async () => {
      redrive.disabled = true;
      try {
        const dry = await api("POST", `${q(queue)}/redrive`, { dry_run: true });
        if (!dry.jobs) {
          confirmInline(panel, "No failed jobs to redrive.", "OK", async () => {});
          return;
        }
        confirmInline(
          panel,
          `${dry.jobs} failed job${dry.jobs === 1 ? "" : "s"} would go back to pending, attempts reset.`,
          `Redrive ${dry.jobs} job${dry.jobs === 1 ? "" : "s"}`,
          (button) =>
            act(
              button,
              () => api("POST", `${q(queue)}/redrive`, { dry_run: false, limit: dry.jobs }),
              (r) => `${r.jobs} job${r.jobs === 1 ? "" : "s"} sent back to pending.`,
            ),
        );
      } catch (err) {
        banner(describe(err), "action");
      } finally {
        redrive.disabled = false;
      }
    });
    prev.addEventListener("click", () => {
      cursor = cursors.pop() || "";
      refresh();
    });
    next.addEventListener("click", () => {
      if (nextCursor === null) return;
      cursors.push(cursor);
      cursor = nextCursor;
      refresh();
    });

    function renderStats(s) {
      const w = s.window;
      const c = s.counts;
      stats.replaceChildren(
        kvTable(
          [...["ready", "scheduled", "pending", "waiting", "running"].map((k) => [k, liveCount(s, k)]),
            ["completed", c.completed], ["failed", c.failed], ["cancelled", c.cancelled]],
          "Jobs by status",
        ),
        kvTable(
          [["oldest ready job waiting", fmtAge(s.oldest_ready_age_seconds)],
            ["jobs on their last attempt", s.jobs_on_last_attempt],
            ["jobs one attempt short", s.jobs_one_attempt_left], ["as of", fmtTime(s.as_of)],
            ...(s.counts_estimated ? [["≈ counted at", s.counts_counted_at ? fmtTime(s.counts_counted_at) : "not yet"]] : [])],
          "Health",
        ),
        kvTable(
          [["enqueued", w.enqueued], ["claimed", w.claimed], ["completed", w.completed],
            ["completions per minute", w.completions_per_minute.toFixed(1)], ["retries", w.retries],
            ["failures", w.failures], ["expired leases", w.lease_expired], ["cancelled", w.cancelled],
            ["released untried", w.released], ["empty claims with ready jobs", w.empty_claims_with_ready_jobs]],
          `Last ${Math.round(w.seconds / 60)} minutes`,
        ),
        kvTable(
          [["measured", w.duration.count], ["p50", fmtMs(w.duration.p50_ms)], ["p95", fmtMs(w.duration.p95_ms)],
            ["max", fmtMs(w.duration.max_ms)]],
          "Claim to completion",
        ),
      );
    }

    function renderJobs(page) {
      const text = JSON.stringify(page);
      if (text !== lastJobs) {
        lastJobs = text;
        jobs.render(page.jobs, cursor ? "No more jobs." : "No jobs with this status.");
      }
      nextCursor = page.next_cursor;
      next.disabled = nextCursor === null;
      prev.disabled = cursor === "";
    }

    return {
      mount(root) {
        const tabs = el(
          "div",
          { class: "toolbar tabs", role: "group", "aria-label": "Status" },
          [null, ...STATUSES].map((s) =>
            el(
              "button",
              {
                type: "button",
                "aria-pressed": String((status || null) === s),
                onclick: () => {
                  location.hash = queueHref(queue, s);
                },
              },
              s || "all",
            ),
          ),
        );
        root.replaceChildren(
          el("p", {}, el("a", { href: "#/" }, "← All queues")),
          el("h2", {}, `Queue ${queue} `, state),
          el("div", { class: "toolbar" }, pause, redrive, enqueue.open),
          enqueue.form,
          panel,
          stats,
          charts.node,
          config.node,
          el("h3", {}, "Jobs"),
          tabs,
          jobs.toolbar,
          jobs.holder,
          el("div", { class: "toolbar" }, prev, next),
        );
      },
      async load() {
        const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
        if (status) params.set("status", status);
        if (cursor) params.set("cursor", cursor);
        const [s, page] = await Promise.all([
          api("GET", `${q(queue)}/stats`),
          api("GET", `${q(queue)}/jobs?${params}`),
          charts.load(false),
        ]);
        paused = s.paused;
        state.replaceChildren(paused ? badge("paused") : badge("active"));
        pause.textContent = paused ? "Resume" : "Pause";
        renderStats(s);
        config.load(s);
        renderJobs(page);
      },
    };
  }

  // --- queue configuration panel (flow control) -------------------------------------------------------------
  // Its own form on the queue page: shows GET /queues/{q}/stats's `config`, `window.held_back` and `groups`,
  // and saves through PATCH /queues/{q}/config. An empty field saves as null (the global setting).

  const CONFIG_FIELDS = [
    ["concurrency", "concurrency (running jobs)"], ["rate.limit", "rate: claims"], ["rate.per_seconds", "rate: per seconds"],
    ["group_concurrency", "group concurrency"], ["group_rate.limit", "group rate: claims"],
    ["group_rate.per_seconds", "group rate: per seconds"], ["max_attempts", "max attempts"],
    ["lease_seconds", "lease seconds"], ["default_priority", "default priority"],
  ];

  function queueConfigPanel(queue) {
    const inputs = {};
    const flags = {};
    const save = el("button", { type: "submit", id: "config-save" }, "Save configuration");
    const held = el("div");
    const groups = el("div");
    const form = el(
      "form",
      { class: "panel", id: "queue-config", "aria-label": "Queue configuration" },
      el("h3", {}, "Configuration"),
      el("div", { class: "grid" },
        CONFIG_FIELDS.map(([name, label]) => {
          inputs[name] = el("input", { type: "number", name, step: "any", "aria-label": label, placeholder: "global" });
          return el("label", {}, `${label} `, inputs[name]);
        }),
        ["fair", "ordered"].map((name) => {
          flags[name] = el("input", { type: "checkbox", name, "aria-label": name });
          return el("label", {}, flags[name], ` ${name}`);
        })),
      el("div", { class: "toolbar" }, save),
      held,
      groups,
    );
    let editing = false;
    form.addEventListener("input", () => { editing = true; });
    const num = (name) => (inputs[name].value === "" ? null : Number(inputs[name].value));
    const rate = (prefix) => {
      const limit = num(`${prefix}.limit`);
      const per = num(`${prefix}.per_seconds`);
      return limit === null && per === null ? null : { limit, per_seconds: per };
    };
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const body = {
        concurrency: num("concurrency"), rate: rate("rate"), group_concurrency: num("group_concurrency"),
        group_rate: rate("group_rate"), max_attempts: num("max_attempts"), lease_seconds: num("lease_seconds"),
        default_priority: num("default_priority"), fair: flags.fair.checked || null, ordered: flags.ordered.checked || null,
      };
      act(save, async () => { const r = await api("PATCH", `${q(queue)}/config`, body); editing = false; return r; },
        () => `Queue ${queue}: configuration saved; every replica applies it now.`);
    });
    return {
      node: form,
      load(stats) {
        const c = stats.config;
        if (!editing) {
          for (const [name] of CONFIG_FIELDS) {
            const [head, tail] = name.split(".");
            const value = tail ? (c[head] ? c[head][tail] : null) : c[head];
            inputs[name].value = value === null || value === undefined ? "" : String(value);
          }
          flags.fair.checked = Boolean(c.fair);
          flags.ordered.checked = Boolean(c.ordered);
        }
        const h = stats.window.held_back;
        held.replaceChildren(kvTable(Object.entries(h), "Claims held back by each limit"));
        // Past JOBQ_STATS_EXACT_MAX some groups' figures are the background's count (at least what the request
        // read) and others exact: which ones the answer does not say, so the list says it of itself.
        groups.replaceChildren(
          stats.groups.length
            ? kvTable(
                stats.groups.map((g) => [g.group, `${g.ready} ready, ${g.running} running`]),
                "Groups with the most ready jobs",
              )
            : el("p", { class: "muted" }, "No grouped jobs are ready."),
          ...(stats.groups_estimated
            ? [el("p", { class: "muted" }, `≈ partly the background's count${stats.groups_counted_at ? ` of ${fmtTime(stats.groups_counted_at)}` : " (not made yet)"}: at least these figures.`)]
            : []),
        );
      },
    };
  }

  // What the worker last reported (a heartbeat's `progress`): a bar when it reads as {done, total}, and the
  // value as JSON in any case. Hidden when nothing was reported during the latest claim.
  function showProgress(box, value) {
    box.hidden = value === null || value === undefined;
    if (box.hidden) return box.replaceChildren();
    const parts = [];
    const { done, total } = typeof value === "object" && value !== null ? value : {};
    if (typeof done === "number" && typeof total === "number" && total > 0) {
      const share = Math.min(Math.max(done / total, 0), 1);
      parts.push(el("progress", { id: "progress-bar", max: String(total), value: String(Math.min(Math.max(done, 0), total)) }),
        el("span", { class: "muted" }, ` ${done} of ${total} (${Math.round(share * 100)}%)`));
    }
    parts.push(el("pre", { id: "progress-value" }, fmtJson(value)));
    box.replaceChildren(...parts);
  }

  // Why a job is not running (GET /jobs/{id}/explain): one line per rule of the claim that holds it.
  const idLinks = (ids) => ids.flatMap((job, i) => [i ? ", " : "", el("a", { href: jobHref(job) }, String(job))]);
  function reasonLine(r) {
    switch (r.kind) {
      case "paused": return ["Its queue is paused."];
      case "scheduled": return ["Scheduled for ", fmtTime(r.run_at), "."];
      case "backoff": return [`Attempt ${r.attempts} failed; its retry is due at `, fmtTime(r.run_at),
        r.last_error ? ` (last error: ${r.last_error})` : "", "."];
      case "concurrency": return [`The queue's concurrency (${r.limit}) is full, held by `, ...idLinks(r.held_by), "."];
      case "rate": return [`The queue's rate (${r.limit} per ${r.per_seconds} s) is used up until `, fmtTime(r.until), "."];
      case "group_concurrency": return [`Group ${r.group}'s concurrency (${r.limit}) is full, held by `, ...idLinks(r.held_by), "."];
      case "group_rate": return [`Group ${r.group}'s rate (${r.limit} per ${r.per_seconds} s) is used up until `, fmtTime(r.until), "."];
      case "ordered": return [`Not its turn in ordered group ${r.group}: job `, ...idLinks([r.behind]), " comes first."];
      case "dependencies": return ["Waiting for jobs ", ...idLinks(r.waiting_for), "."];
      default: return [r.kind];
    }
  }

  function showExplanation(box, title, doc) {
    const shown = doc && ["pending", "waiting"].includes(doc.status);
    box.hidden = title.hidden = !shown;
    if (!shown) return box.replaceChildren();
    box.replaceChildren(doc.runnable
      ? el("p", { "data-kind": "runnable" }, "Nothing holds it: the next claim of its queue may take it.")
      : el("ul", {}, doc.reasons.map((r) => el("li", { "data-kind": r.kind }, reasonLine(r)))));
  }

  function jobView(id) {
    const back = el("p");
    const title = el("h2", {}, `Job ${id} `);
    const state = el("span");
    const cancel = el("button", { type: "button", id: "cancel", hidden: true }, "Cancel job…");
    const retry = el("button", { type: "button", id: "retry", hidden: true }, "Retry job");
    const panel = el("div", { class: "panel", hidden: true });
    const fields = el("dl", { class: "fields", id: "job-fields" });
    const payload = el("pre", { id: "payload" });
    const result = el("pre", { id: "result" });
    const error = el("pre", { id: "last-error", class: "error" });
    const progressTitle = el("h3", { hidden: true }, "Progress");
    const progress = el("div", { id: "progress", hidden: true });
    const whyTitle = el("h3", { hidden: true }, "Why it is not running");
    const why = el("div", { id: "explain", hidden: true });
    title.append(state);

    retry.addEventListener("click", () =>
      act(retry, () => api("POST", `jobs/${id}/retry`), (job) => `Job ${job.id} is ${job.status} again.`),
    );
    cancel.addEventListener("click", () =>
      confirmInline(panel, `Cancel job ${id}? A running job's worker learns it at its next heartbeat.`, "Cancel job",
        (button) => act(button, () => api("POST", `jobs/${id}/cancel`, {}), (job) => `Job ${job.id} ${job.status}.`)),
    );

    return {
      mount(root) {
        root.replaceChildren(
          back,
          title,
          el("div", { class: "toolbar" }, retry, cancel),
          panel,
          fields,
          whyTitle,
          why,
          progressTitle,
          progress,
          el("h3", {}, "Payload"),
          payload,
          el("h3", {}, "Result"),
          result,
          el("h3", {}, "Last error"),
          error,
        );
      },
      async load() {
        const job = await api("GET", `jobs/${encodeURIComponent(id)}`);
        const explained = ["pending", "waiting"].includes(job.status)
          ? await api("GET", `jobs/${encodeURIComponent(id)}/explain`)
          : null;
        showExplanation(why, whyTitle, explained);
        back.replaceChildren(el("a", { href: queueHref(job.queue) }, `← Queue ${job.queue}`));
        state.replaceChildren(badge(job.status));
        retry.hidden = !["failed", "cancelled", "completed"].includes(job.status);
        cancel.hidden = !["pending", "waiting", "running"].includes(job.status);
        const rows = [
          ["queue", job.queue], ["status", job.status], ["attempts", `${job.attempts} of ${job.max_attempts}`],
          ["priority", job.priority], ["worker", job.worker ?? none()], ["created", fmtTime(job.created_at)],
          ["run at", fmtTime(job.run_at)], ["claimed", fmtTime(job.claimed_at)],
          ["lease expires", fmtTime(job.lease_expires_at)], ["finished", fmtTime(job.finished_at)],
          ["idempotency key", job.idempotency_key ?? none()],
          ["timeout", job.timeout_seconds ? `${job.timeout_seconds} s` : none()],
        ];
        if (job.schedule !== null && job.schedule !== undefined) {
          rows.push(["schedule", job.schedule], ["scheduled for", fmtTime(job.scheduled_for)]);
        }
        if (job.unique) {
          // A unique job: the key it holds, in which states, and within which window (docs/producers.md).
          rows.push(["unique key", job.unique.key], ["unique while", job.unique.while.join(", ")]);
          if (job.unique.window_start) {
            rows.push(["unique window", `${fmtTime(job.unique.window_start)} to ${fmtTime(job.unique.window_end)}`]);
          }
        }
        if (job.debounce) {
          // A debounced job: its key, and the latest its run time can be moved to.
          rows.push(["debounce key", job.debounce.key], ["debounce", `${job.debounce.seconds} s after the latest enqueue`]);
          if (job.debounce.run_by) rows.push(["runs by", fmtTime(job.debounce.run_by)]);
        }
        if (job.depends_on) {
          // The jobs it runs after, each a link; while waiting, how many have not finished yet.
          const links = job.depends_on.flatMap((parent, i) => [
            i ? ", " : "", el("a", { href: jobHref(parent) }, String(parent)),
          ]);
          rows.push(["depends on", el("span", {}, links)], ["if one fails", job.on_dependency_failure]);
          if (job.status === "waiting") rows.push(["waiting for", `${job.pending_dependencies} of them`]);
        }
        fields.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
        payload.textContent = fmtJson(job.payload);
        result.textContent = fmtJson(job.result);
        error.textContent = job.last_error ?? "none";
        showProgress(progress, job.progress);
        progressTitle.hidden = progress.hidden;
      },
    };
  }

  // Search: the form's fields live in the address (#/search?...), so a search can be bookmarked and the back
  // button works. A search runs when the view opens, on "Search further", and after an action, not on every
  // automatic refresh: each page may examine thousands of jobs.
  const SEARCH_FIELDS = [
    ["id", "Job id", "id", { type: "number", min: 1, step: 1 }],
    ["key", "Idempotency key", "idempotency_key", {}],
    ["error", "Error contains", "error_contains", {}],
    ["payload", "Payload contains (JSON)", "payload_contains", { placeholder: '{"customer": 42}' }],
    ["queue", "Queue", "queue", {}],
  ];

  function searchView(params) {
    const panel = el("div", { class: "panel", id: "confirm", hidden: true });
    const summary = el("p", { id: "search-summary", class: "muted" });
    const further = el("button", { type: "button", id: "search-further", hidden: true }, "Search further");
    const inputs = {};
    let stale = true;
    let results = [];
    let cursor = null;
    let nextCursor = null;
    let examined = 0;
    const table = selectableJobs("search-results", panel, () => {
      stale = true; // start again: the statuses changed, and so may the matches
      cursor = null;
    });

    const form = el("form", { class: "panel search", id: "search-form", role: "search", "aria-label": "Search jobs" });
    for (const [name, label, , attrs] of SEARCH_FIELDS) {
      inputs[name] = el("input", { name, spellcheck: "false", ...attrs, value: params.get(name) || "" });
      form.append(el("label", {}, el("span", {}, label), inputs[name]));
    }
    inputs.status = el("select", { name: "status" }, el("option", { value: "" }, "any"),
      STATUSES.map((st) => el("option", { value: st, selected: params.get("status") === st }, st)));
    form.append(el("label", {}, el("span", {}, "Status"), inputs.status), el("button", { type: "submit" }, "Search"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const next = new URLSearchParams();
      for (const [name, input] of Object.entries(inputs)) if (input.value.trim()) next.set(name, input.value.trim());
      const hash = `#/search?${next}`;
      if (location.hash === hash) {
        cursor = null;
        stale = true;
        refresh();
      } else location.hash = hash;
    });
    further.addEventListener("click", () => {
      cursor = nextCursor;
      stale = true;
      refresh();
    });

    function request() {
      const body = { limit: PAGE_SIZE };
      for (const [name, , field] of SEARCH_FIELDS) {
        const text = params.get(name);
        if (!text) continue;
        if (name === "id") body.id = Number(text);
        else if (name === "payload") {
          try {
            body.payload_contains = JSON.parse(text);
          } catch (err) {
            throw new ApiError(422, { title: "Payload filter", detail: `Not valid JSON: ${err.message}` });
          }
        } else body[field] = text;
      }
      if (params.get("status")) body.status = params.get("status");
      if (cursor) body.cursor = cursor;
      return body;
    }

    return {
      mount(root) {
        root.replaceChildren(
          el("p", {}, el("a", { href: "#/" }, "← All queues")),
          el("h2", {}, "Search jobs"),
          form,
          panel,
          summary,
          table.toolbar,
          table.holder,
          el("div", { class: "toolbar" }, further),
        );
      },
      async load() {
        if (!stale) return;
        if (![...params.keys()].length) {
          stale = false;
          summary.textContent = "Find jobs by id, idempotency key, text in their last error or JSON in their payload.";
          table.render([], "");
          return;
        }
        const page = await api("POST", "jobs/search", request());
        stale = false;
        // "Search further" adds a page to what is shown; an action reloads the pages shown so far.
        results = cursor ? [...results, ...page.jobs] : page.jobs;
        examined = (cursor ? examined : 0) + page.examined;
        nextCursor = page.next_cursor;
        further.hidden = nextCursor === null;
        const more = page.partial ? " Stopped at the scan limit: more jobs may match further on." : "";
        summary.textContent = `${plural(results.length, "job")} found; ${plural(examined, "job")} examined.${more}`;
        table.render(results, "No job matches.");
      },
    };
  }

  // Workers: live ones, and those gone recently, each with the jobs it holds now (GET /workers).
  function workersView() {
    const body = el("div", { id: "workers" });
    let last = "";
    const jobLinks = (w) => {
      if (!w.jobs_held) return none();
      const links = w.job_ids.flatMap((id, i) => [i ? ", " : "", el("a", { href: jobHref(id) }, String(id))]);
      const more = w.jobs_held > w.job_ids.length ? ` and ${w.jobs_held - w.job_ids.length} more` : "";
      return el("span", {}, links, more);
    };
    const rows = (workers) => workers.map((w) =>
      el("tr", { "data-worker": w.name },
        el("td", {}, w.name),
        el("td", { "data-col": "queues" }, w.queues.flatMap((queue, i) => [i ? ", " : "", el("a", { href: queueHref(queue) }, queue)])),
        el("td", { "data-col": "sdk" }, [w.sdk, w.version].filter(Boolean).join(" ") || none()),
        el("td", { "data-col": "host" }, w.host ?? none()),
        el("td", { "data-col": "jobs" }, jobLinks(w)),
        el("td", { class: "num", "data-col": "completed" }, String(w.completed_last_hour)),
        el("td", { class: "num", "data-col": "failed" }, String(w.failed_last_hour)),
        el("td", { "data-col": "last-seen" }, fmtTime(w.last_seen))));
    const tableOf = (id, caption, workers, empty) =>
      workers.length
        ? el("table", { id },
          el("caption", {}, caption),
          el("thead", {}, el("tr", {}, ["Worker", "Queues", "SDK", "Host", "Holds", "Completed (1 h)", "Failed (1 h)", "Last seen"]
            .map((h) => el("th", {}, h)))),
          el("tbody", {}, rows(workers)))
        : el("p", { class: "muted", id: `${id}-empty` }, empty);
    return {
      mount(root) {
        root.replaceChildren(el("h2", {}, "Workers"), body);
      },
      async load() {
        const doc = await api("GET", "workers");
        const text = JSON.stringify(doc);
        if (text === last) return;
        last = text;
        const live = doc.workers.filter((w) => w.state === "live");
        const gone = doc.workers.filter((w) => w.state === "gone");
        body.replaceChildren(
          tableOf("live-workers", `Live (${live.length})`, live, "No live worker: none holds a lease or was seen lately."),
          tableOf("gone-workers", `Gone recently (${gone.length})`, gone, "No worker has gone lately."),
        );
      },
    };
  }

  function notFoundView() {
    return {
      mount(root) {
        root.replaceChildren(el("p", {}, "Nothing here. ", el("a", { href: "#/" }, "See the queues.")));
      },
      async load() {},
    };
  }

  // --- routing and refresh -----------------------------------------------------------------------------------

  function route() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [path, query] = hash.split("?");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    if (parts.length === 0) return queuesView();
    if (parts[0] === "queues" && parts.length === 2) {
      const status = new URLSearchParams(query || "").get("status");
      return queueView(parts[1], STATUSES.includes(status) ? status : null);
    }
    if (parts[0] === "jobs" && parts.length === 2 && /^[0-9]+$/.test(parts[1])) return jobView(parts[1]);
    if (parts[0] === "search" && parts.length === 1) return searchView(new URLSearchParams(query || ""));
    if (parts[0] === "workers" && parts.length === 1) return workersView();
    return notFoundView();
  }

  let current = null;
  let loading = null;
  let failures = 0; // refreshes failed in a row
  let lastTook = 0; // how long the last refresh took (ms)

  async function refresh() {
    if (loading) return loading;
    const view = current;
    const started = Date.now();
    loading = (async () => {
      try {
        await view.load();
        failures = 0;
        if (view !== current) return;
        if (bannerKind === "load") banner("", null);
        $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      } catch (err) {
        failures += 1;
        if (view === current) loadFailed(err);
      } finally {
        lastTook = Date.now() - started;
        loading = null;
      }
    })();
    return loading;
  }

  // The automatic refresh: every REFRESH_MS while the tab is shown; backing off (doubling, up to
  // REFRESH_MAX_MS) while refreshes fail (a 429 or 503 asks for fewer requests, not more), and pausing
  // at least five times as long as a refresh takes, so that a slow server is not asked again at once.
  // A hidden tab (document.visibilityState) asks for nothing; shown again, it refreshes at once.
  // The state shows in <body data-refresh>: "paused", or the pause before the next refresh.
  let timer = null;

  function refreshDelay() {
    const backoff = failures ? REFRESH_MS * 2 ** Math.min(failures, 5) : REFRESH_MS;
    return Math.min(REFRESH_MAX_MS, Math.max(backoff, 5 * lastTook));
  }

  function schedule() {
    clearTimeout(timer);
    timer = null;
    if (document.visibilityState === "hidden") {
      document.body.dataset.refresh = "paused";
      return;
    }
    const delay = refreshDelay();
    document.body.dataset.refresh = String(delay);
    timer = setTimeout(async () => {
      if ($("auto-refresh").checked && $("login").hidden) await refresh();
      schedule();
    }, delay);
  }

  async function navigate() {
    if (loading) await loading;
    current = route();
    if (bannerKind === "action") banner("", null);
    current.mount($("view"));
    await refresh();
  }

  function start() {
    syncKeyButton();
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORE, key);
      $("key-input").value = "";
      $("login").hidden = true;
      syncKeyButton();
      navigate();
    });
    $("forget-key").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORE);
      syncKeyButton();
      navigate();
    });
    $("banner").addEventListener("click", () => banner("", null));
    window.addEventListener("hashchange", navigate);
    document.addEventListener("visibilitychange", async () => {
      if (document.visibilityState === "visible" && $("auto-refresh").checked && $("login").hidden) {
        await refresh();
      }
      schedule();
    });
    schedule();
    navigate();
  }

  start();
})();
