// jobq dashboard: reads the JSON API and acts through it. Every value from the API reaches the page as a
// text node (el() and textContent), never parsed as markup: the server's Content-Security-Policy enforces
// Trusted Types, so handing a string to an HTML sink would throw rather than parse a job's payload or error.
"use strict";

(() => {
  const KEY_STORE = "jobq.apiKey"; // sessionStorage: this tab only, gone when it closes
  const REFRESH_MS = 3000;
  const PAGE_SIZE = 50;
  const STATUSES = ["pending", "running", "completed", "failed", "cancelled"];

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

  // --- schedules: next run times (a panel of the queues view) ------------------------------------------------

  // The schedules the key may see, each with its next run; built once, refilled on every refresh.
  function schedulesPanel() {
    const body = el("div", { id: "schedules-panel" });
    let last = "";
    const cols = ["Schedule", "Queue", "Cron", "Time zone", "Next run", "Last run", "State"];
    return {
      node: el("section", { "aria-label": "Schedules" }, el("h2", {}, "Schedules"), body),
      async load() {
        const doc = await api("GET", "schedules");
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
    const schedules = schedulesPanel();
    let last = "";
    return {
      mount(root) {
        root.replaceChildren(el("h2", {}, "Queues"), body, schedules.node);
      },
      async load() {
        await Promise.all([this.loadQueues(), schedules.load()]);
      },
      async loadQueues() {
        const doc = await api("GET", "queues");
        const text = JSON.stringify(doc);
        if (text === last) return;
        last = text;
        if (!doc.queues.length) {
          body.replaceChildren(el("p", { class: "muted" }, "No queues yet: a queue appears with its first job."));
          return;
        }
        const cols = ["ready", "scheduled", "running", "completed", "failed", "cancelled"];
        body.replaceChildren(
          el(
            "table",
            { id: "queues" },
            el(
              "thead",
              {},
              el("tr", {}, el("th", {}, "Queue"), el("th", {}, "State"), cols.map((c) => el("th", { class: "num" }, c)),
                el("th", { class: "num" }, "oldest ready")),
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
                  cols.map((c) => el("td", { class: "num", "data-col": c }, item.counts[c])),
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
    const jobs = el("div", { id: "jobs" });
    const prev = el("button", { type: "button", id: "prev-page" }, "Previous page");
    const next = el("button", { type: "button", id: "next-page" }, "Next page");
    const cursors = []; // cursors of the pages before this one ("" for the first)
    let cursor = "";
    let nextCursor = null;
    let paused = null;
    let lastJobs = "";

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
          [["ready", c.ready], ["scheduled", c.scheduled], ["pending", c.pending], ["running", c.running],
            ["completed", c.completed], ["failed", c.failed], ["cancelled", c.cancelled]],
          "Jobs by status",
        ),
        kvTable(
          [["oldest ready job waiting", fmtAge(s.oldest_ready_age_seconds)],
            ["jobs on their last attempt", s.jobs_on_last_attempt],
            ["jobs one attempt short", s.jobs_one_attempt_left], ["as of", fmtTime(s.as_of)]],
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
        jobs.replaceChildren(
          page.jobs.length
            ? el(
                "table",
                { id: "job-list" },
                el("thead", {}, el("tr", {}, ["id", "status", "attempts", "priority", "run at", "created", "finished",
                  "last error"].map((h) => el("th", {}, h)))),
                el(
                  "tbody",
                  {},
                  page.jobs.map((job) =>
                    el(
                      "tr",
                      { "data-job": job.id },
                      el("td", {}, el("a", { href: jobHref(job.id) }, job.id)),
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
              )
            : el("p", { class: "muted" }, cursor ? "No more jobs." : "No jobs with this status."),
        );
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
          el("div", { class: "toolbar" }, pause, redrive),
          panel,
          stats,
          config.node,
          el("h3", {}, "Jobs"),
          tabs,
          jobs,
          el("div", { class: "toolbar" }, prev, next),
        );
      },
      async load() {
        const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
        if (status) params.set("status", status);
        if (cursor) params.set("cursor", cursor);
        const [s, page] = await Promise.all([api("GET", `${q(queue)}/stats`), api("GET", `${q(queue)}/jobs?${params}`)]);
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
        groups.replaceChildren(
          stats.groups.length
            ? kvTable(stats.groups.map((g) => [g.group, `${g.ready} ready, ${g.running} running`]), "Groups with the most ready jobs")
            : el("p", { class: "muted" }, "No grouped jobs are ready."),
        );
      },
    };
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
        back.replaceChildren(el("a", { href: queueHref(job.queue) }, `← Queue ${job.queue}`));
        state.replaceChildren(badge(job.status));
        retry.hidden = !["failed", "cancelled"].includes(job.status);
        cancel.hidden = !["pending", "running"].includes(job.status);
        const rows = [
          ["queue", job.queue], ["status", job.status], ["attempts", `${job.attempts} of ${job.max_attempts}`],
          ["priority", job.priority], ["worker", job.worker ?? none()], ["created", fmtTime(job.created_at)],
          ["run at", fmtTime(job.run_at)], ["claimed", fmtTime(job.claimed_at)],
          ["lease expires", fmtTime(job.lease_expires_at)], ["finished", fmtTime(job.finished_at)],
          ["idempotency key", job.idempotency_key ?? none()],
        ];
        if (job.schedule !== null && job.schedule !== undefined) {
          rows.push(["schedule", job.schedule], ["scheduled for", fmtTime(job.scheduled_for)]);
        }
        fields.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k }, v)]));
        payload.textContent = fmtJson(job.payload);
        result.textContent = fmtJson(job.result);
        error.textContent = job.last_error ?? "none";
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
    return notFoundView();
  }

  let current = null;
  let loading = null;

  async function refresh() {
    if (loading) return loading;
    const view = current;
    loading = (async () => {
      try {
        await view.load();
        if (view !== current) return;
        if (bannerKind === "load") banner("", null);
        $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      } catch (err) {
        if (view === current) loadFailed(err);
      } finally {
        loading = null;
      }
    })();
    return loading;
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
    setInterval(() => {
      if ($("auto-refresh").checked && $("login").hidden && !document.hidden) refresh();
    }, REFRESH_MS);
    navigate();
  }

  start();
})();
