// The TypeScript SDK against a live jobq (JOBQ_URL; tests/test_client_typescript.py starts one with a fast
// sweeper and short backoff), plus its retry decisions against a stand-in HTTP server of its own.
//   JOBQ_URL=http://127.0.0.1:8000 node --test test/
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  CANCEL_REQUESTED,
  ClaimLost,
  Client,
  JobCancelled,
  JobNotFound,
  NO_RETRY,
  PermanentFailure,
  RetryLater,
  ServiceUnavailable,
  TIMED_OUT,
  TransportError,
  ValidationError,
  WaitTimeout,
  Worker,
  enqueueBatchInTransaction,
  enqueueInTransaction,
  finished,
} from "../dist/index.js";

const URL = process.env.JOBQ_URL ?? "http://127.0.0.1:8000";
const QUICK = { attempts: 20, backoffBase: 0.01, backoffMax: 0.05 };
const quiet = { info: () => {}, warn: () => {}, error: (m, e) => console.error(m, e ?? "") };
let counter = 0;
const queueName = (what) => `ts-${what}-${process.pid}-${++counter}`;

/** A Client whose requests are recorded as [method, path, body]; `rewrite` may answer in the server's place. */
function recording(rewrite) {
  const requests = [];
  const fetchSpy = async (url, init = {}) => {
    const body = init.body ? JSON.parse(init.body) : undefined;
    requests.push([init.method, new globalThis.URL(url).pathname, body]);
    return (rewrite && (await rewrite(url, init, body))) || fetch(url, init);
  };
  return { client: new Client(URL, { fetch: fetchSpy, retry: QUICK }), requests };
}

async function until(condition, what, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${seconds}s`);
    await sleep(20);
  }
}

/** Run the worker in the background; returns a function that stops it and waits for run() to end. */
function running(worker) {
  const done = worker.run({ handleSignals: false });
  return async (options) => {
    worker.stop(options);
    await done;
  };
}

describe("Client against jobq", () => {
  const jobq = new Client(URL, { retry: QUICK });

  test("the API tour: enqueue, claim, heartbeat, complete, fail, release, batch complete, get job", async () => {
    const q = queueName("tour");
    const job = await jobq.enqueue(q, { to: "ada@example.com" }, { priority: 5, idempotencyKey: "welcome-ada" });
    assert.equal(job.status, "pending");
    assert.equal((await jobq.enqueue(q, { to: "ada@example.com" }, { idempotencyKey: "welcome-ada" })).id, job.id);
    const later = await jobq.enqueue(q, "later", { runAt: new Date(Date.now() + 3_600_000) });
    assert.ok(Date.parse(later.run_at) > Date.parse(later.created_at));
    const batch = await jobq.enqueueBatch(q, [{ payload: 1 }, { payload: 2 }, { payload: 3, maxAttempts: 1 }]);
    assert.deepEqual(batch.map((j) => j.payload), [1, 2, 3]);

    const [a, b, c, d] = await jobq.claim(q, "ts-test", { limit: 10, leaseSeconds: 60 });
    assert.equal(a.id, job.id);
    assert.ok(d && a.claim_token && a.attempts === 1);
    const beat = await jobq.heartbeat(a.id, a.claim_token, { leaseSeconds: 120 });
    assert.equal(beat.cancel_requested, false);
    assert.ok(Date.parse(beat.lease_expires_at) > Date.now() + 100_000);

    const completed = await jobq.complete(a.id, a.claim_token, { message_id: "abc" });
    assert.equal(completed.status, "completed");
    assert.deepEqual((await jobq.complete(a.id, a.claim_token, "again")).result, { message_id: "abc" }); // a retry
    const failed = await jobq.fail(b.id, b.claim_token, "SMTP 451", { retryInSeconds: 30 });
    assert.equal(failed.status, "pending");
    assert.equal(failed.last_error, "SMTP 451");
    assert.equal((await jobq.fail(d.id, d.claim_token, "bad", { retry: false })).status, "failed");
    const released = await jobq.release(c.id, c.claim_token);
    assert.equal(released.attempts, 0);
    await assert.rejects(jobq.release(c.id, c.claim_token), ClaimLost);

    const [again] = await jobq.claim(q, "ts-test");
    const outcomes = await jobq.completeMany([
      { id: again.id, claimToken: again.claim_token, result: "sent" },
      { id: b.id, claimToken: b.claim_token },
    ]);
    assert.deepEqual(outcomes.map((o) => o.outcome), ["completed", "claim_lost"]);
    assert.equal((await jobq.getJob(again.id)).result, "sent");
    assert.equal((await jobq.stats(q)).counts.completed, 2);
  });

  test("minimal: true asks for ids and states (Prefer: return=minimal); the default answer is the job", async () => {
    const seen = [];
    const fetchSpy = async (url, init = {}) => {
      const response = await fetch(url, init);
      seen.push([new globalThis.URL(url).pathname, init.headers?.prefer, response.headers.get("preference-applied")]);
      return response;
    };
    const client = new Client(URL, { fetch: fetchSpy, retry: QUICK });
    const q = queueName("minimal");
    const first = await client.enqueue(q, { big: "x".repeat(100) }, { idempotencyKey: "k", minimal: true });
    assert.deepEqual(first, { id: first.id, status: "pending", created: true, enqueued: "created" });
    assert.deepEqual(await client.enqueue(q, 2, { idempotencyKey: "k", minimal: true }), {
      id: first.id,
      status: "pending",
      created: false,
      enqueued: "existing",
    });
    const batch = await client.enqueueBatch(q, [{ payload: 1 }, { payload: 2, idempotencyKey: "k" }], { minimal: true });
    assert.deepEqual(batch.map((j) => [j.status, j.created, j.enqueued]), [["pending", true, "created"], ["pending", false, "existing"]]);
    assert.equal(batch[1].id, first.id);
    const [a, b] = await client.claim(q, "ts-test", { limit: 2 });
    assert.deepEqual(await client.complete(a.id, a.claim_token, { r: 1 }, { minimal: true }), { id: a.id, status: "completed" });
    assert.deepEqual((await client.getJob(a.id)).result, { r: 1 });
    assert.deepEqual(await client.fail(b.id, b.claim_token, "e", { retry: false, minimal: true }), { id: b.id, status: "failed" });
    assert.equal((await client.enqueue(q, 3)).payload, 3);
    const minimal = seen.filter(([, prefer]) => prefer !== undefined);
    assert.equal(minimal.length, 5);
    assert.ok(minimal.every(([, prefer, applied]) => prefer === "return=minimal" && applied === "return=minimal"));
    assert.deepEqual(seen.at(-1), [`/queues/${q}/jobs`, undefined, null]);
  });

  test("dependencies: a job waits for its parents; a batch names earlier items by ref", async () => {
    const q = queueName("deps");
    const parent = await jobq.enqueue(q, "parent");
    const child = await jobq.enqueue(q, "child", { dependsOn: [parent.id], onDependencyFailure: "run" });
    assert.equal(child.status, "waiting");
    assert.deepEqual(child.depends_on, [parent.id]);
    assert.equal(child.on_dependency_failure, "run");
    const [fetch, publish] = await jobq.enqueueBatch(q, [
      { payload: "fetch", ref: "fetch" },
      { payload: "publish", dependsOn: ["fetch", { ref: 0 }, parent.id] },
    ]);
    assert.deepEqual(publish.depends_on, [fetch.id, parent.id]);
    assert.equal(publish.pending_dependencies, 2);
    const [claim] = await jobq.claim(q, "ts-test");
    assert.equal(claim.id, parent.id);
    await jobq.complete(claim.id, claim.claim_token);
    assert.equal((await jobq.getJob(child.id)).status, "pending");
  });

  test("unique: a repeat returns the job that holds the key, in a batch too", async () => {
    const q = queueName("unique");
    const first = await jobq.enqueue(q, { doc: 1 }, { unique: { key: "reindex-1", for_seconds: 3600 } });
    assert.equal(first.unique.key, "reindex-1");
    assert.equal(first.unique.for_seconds, 3600);
    assert.deepEqual(first.unique.while, ["pending", "running", "completed"]);
    const again = await jobq.enqueue(q, { doc: 2 }, { unique: { key: "reindex-1", for_seconds: 3600 } });
    assert.equal(again.id, first.id);
    assert.deepEqual([first.enqueued, again.enqueued], ["created", "existing"]);
    const [a, b] = await jobq.enqueueBatch(q, [{ payload: 7, unique: {} }, { payload: 7, unique: {} }]);
    assert.equal(a.id, b.id);
    await assert.rejects(jobq.enqueue(q, 1, { unique: { while: ["pending"] } }), ValidationError);
  });

  test("debounce: a second enqueue replaces the pending job", async () => {
    const q = queueName("debounce");
    const debounce = { key: "reindex-9", seconds: 600, max_wait_seconds: 3600 };
    const first = await jobq.enqueue(q, { rev: 1 }, { debounce });
    assert.equal(first.debounce.key, "reindex-9");
    assert.equal(first.debounce.seconds, 600);
    const again = await jobq.enqueue(q, { rev: 2 }, { debounce });
    assert.equal(again.id, first.id);
    assert.equal(again.enqueued, "replaced");
    const [a, b] = await jobq.enqueueBatch(q, [{ payload: 3, debounce }, { payload: 4 }]);
    assert.deepEqual([a.id, a.enqueued, b.enqueued], [first.id, "replaced", "created"]);
    assert.deepEqual(again.payload, { rev: 2 });
    await assert.rejects(jobq.enqueue(q, 1, { debounce: { key: "k", seconds: 10, max_wait_seconds: 5 } }), ValidationError);
  });

  test("problems are typed errors", async () => {
    const q = queueName("errors");
    await jobq.enqueue(q, null);
    const [claim] = await jobq.claim(q, "ts-test");
    await assert.rejects(jobq.complete(claim.id, "stale-token"), (e) => e instanceof ClaimLost && e.status === 409);
    await assert.rejects(jobq.heartbeat(2 ** 52, "x"), JobNotFound);
    const refused = await jobq.claim(q, "ts-test", { limit: 0 }).catch((e) => e);
    assert.ok(refused instanceof ValidationError);
    assert.deepEqual(refused.errors[0].loc, ["body", "limit"]);
    assert.equal(refused.slug, "validation-error");
    await fetch(`${URL}/jobs/${claim.id}/cancel`, { method: "POST" });
    await assert.rejects(jobq.complete(claim.id, claim.claim_token), JobCancelled);
    await assert.rejects(jobq.enqueue(q, Number.NaN), TypeError); // strict JSON, refused before sending
  });

  test("enqueueAndWait answers with the job once a worker finished it; wait gives up after its timeout", async () => {
    const q = queueName("wait");
    const waiting = jobq.enqueueAndWait(q, { n: 21 }, { timeoutSeconds: 60, idempotencyKey: "ask-1" });
    let claim;
    while (!claim) [claim] = await jobq.claim(q, "ts-test", { waitSeconds: 1 });
    await jobq.complete(claim.id, claim.claim_token, { n: 42 });
    const done = await waiting;
    assert.equal(done.id, claim.id);
    assert.equal(done.status, "completed");
    assert.deepEqual(done.result, { n: 42 });
    assert.ok(finished(done));
    assert.equal((await jobq.wait(done.id)).status, "completed"); // finished already: at once

    const { client, requests } = recording();
    client.waitChunkSeconds = 0.2;
    const idle = await client.enqueue(q + "-idle", "nobody works here");
    // Ten chunks: in 0.7 s, three waits needed each request under 0.35 s, which a loaded machine can miss.
    const timedOut = await client.wait(idle.id, { timeoutSeconds: 2 }).catch((e) => e);
    assert.ok(timedOut instanceof WaitTimeout, timedOut);
    assert.equal(timedOut.job.id, idle.id);
    assert.equal(timedOut.job.status, "pending");
    assert.ok(requests.filter(([method]) => method === "GET").length >= 3, "several server waits");
    await assert.rejects(jobq.wait(2 ** 52, { timeoutSeconds: 5 }), JobNotFound);
  });
});

// Enqueue from SQL in the application's own transaction, through node-postgres (a dev dependency only):
// JOBQ_DATABASE_URL is jobq's database (tests/test_client_typescript.py passes it).
describe("enqueue in the caller's transaction", { skip: !process.env.JOBQ_DATABASE_URL }, () => {
  const jobq = new Client(URL, { retry: QUICK });

  test("the job exists if and only if the transaction commits, with every option", async () => {
    const { default: pg } = await import("pg");
    const db = new pg.Client({ connectionString: process.env.JOBQ_DATABASE_URL });
    await db.connect();
    try {
      const q = queueName("sql");
      await db.query("BEGIN");
      const id = await enqueueInTransaction(db, q, { order: 1 }, {
        priority: 5, delaySeconds: 0, maxAttempts: 3, group: "t1", idempotencyKey: "order-1", timeoutSeconds: 60,
      });
      await assert.rejects(jobq.getJob(id), JobNotFound); // not before the commit
      await db.query("COMMIT");
      const job = await jobq.getJob(id);
      assert.deepEqual([job.payload, job.priority, job.max_attempts, job.group], [{ order: 1 }, 5, 3, "t1"]);

      await db.query("BEGIN");
      const gone = await enqueueInTransaction(db, q, "rolled back");
      await db.query("ROLLBACK");
      await assert.rejects(jobq.getJob(gone), JobNotFound);

      await db.query("BEGIN");
      assert.equal(await enqueueInTransaction(db, q, { order: 1 }, { idempotencyKey: "order-1" }), id);
      const held = await enqueueInTransaction(db, q, 7, { unique: { key: "u", for_seconds: 60 } });
      assert.equal(await enqueueInTransaction(db, q, 8, { unique: { key: "u", for_seconds: 60 } }), held);
      assert.equal(await enqueueInTransaction(db, q, 9, { unique: true }), await enqueueInTransaction(db, q, 9, { unique: true }));
      const debounced = await enqueueInTransaction(db, q, 1, { debounce: { key: "d", seconds: 600 } });
      assert.equal(await enqueueInTransaction(db, q, 2, { debounce: { key: "d", seconds: 600 } }), debounced);
      const child = await enqueueInTransaction(db, q, 3, { dependsOn: [id], onDependencyFailure: "run" });
      const ids = await enqueueBatchInTransaction(db, q, [{ payload: 10, ref: "a" }, { payload: 11, dependsOn: ["a"] }]);
      await db.query("COMMIT");
      assert.deepEqual((await jobq.getJob(debounced)).payload, 2);
      assert.equal((await jobq.getJob(child)).status, "waiting");
      assert.deepEqual(await Promise.all(ids.map(async (i) => (await jobq.getJob(i)).status)), ["pending", "waiting"]);

      await db.query("BEGIN");
      await assert.rejects(enqueueInTransaction(db, q, 1, { priority: 10 ** 6 }), (e) => e.code === "22023" && /priority/.test(e.message));
      await db.query("ROLLBACK");
      await assert.rejects(enqueueInTransaction(db, q, 1, { schema: "jobq; DROP TABLE x" }), TypeError);
    } finally {
      await db.end();
    }
  });
});

describe("retries (a stand-in server)", () => {
  let answers = [];
  const seen = [];
  const server = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const [status, body, headers] = answers.shift() ?? [500, {}, {}];
    res.writeHead(status, { "content-type": "application/json", ...headers });
    res.end(JSON.stringify(body));
  });
  const listening = new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  after(() => server.close());
  const unavailable = [503, { type: "urn:jobq:problem:shutting-down", title: "Shutting down", status: 503, detail: "x", instance: "/" }, { "retry-after": "0" }];
  const job = { id: 7, queue: "q", status: "pending" };

  async function client(...queued) {
    await listening;
    answers = queued;
    seen.length = 0;
    return new Client(`http://127.0.0.1:${server.address().port}`, { retry: QUICK });
  }

  test("a 503 is retried on a repeatable call, and an enqueue only with an idempotency key", async () => {
    const c = await client(unavailable, [200, job]);
    assert.equal((await c.complete(7, "t")).id, 7);
    assert.equal(seen.length, 2);
    const keyless = await client(unavailable, [201, job]);
    await assert.rejects(keyless.enqueue("q", 1), ServiceUnavailable);
    assert.equal(seen.length, 1);
    const keyed = await client(unavailable, [201, job]);
    assert.equal((await keyed.enqueue("q", 1, { idempotencyKey: "k" })).id, 7);
    assert.equal(seen.length, 2);
  });

  test("an in-doubt enqueue (503, or the connection cut after the request was sent) is retried with the same key", async () => {
    // The commit may have happened: only the same idempotency key makes the repeat harmless.
    const bodies = [];
    let cut = 1;
    const inDoubt = createServer((req, res) => {
      let text = "";
      req.on("data", (chunk) => (text += chunk));
      req.on("end", () => {
        bodies.push(JSON.parse(text));
        if (cut-- > 0) return req.socket.destroy(); // the answer is lost
        if (bodies.length === 2) {
          res.writeHead(503, { "content-type": "application/problem+json", "retry-after": "0" });
          return res.end(JSON.stringify(unavailable[1]));
        }
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify(job));
      });
    });
    await new Promise((resolve) => inDoubt.listen(0, "127.0.0.1", resolve));
    try {
      const c = new Client(`http://127.0.0.1:${inDoubt.address().port}`, { retry: QUICK });
      assert.equal((await c.enqueue("q", 1, { idempotencyKey: "order-17" })).id, 7);
      assert.equal(bodies.length, 3);
      assert.deepEqual(bodies.map((b) => b.idempotency_key), ["order-17", "order-17", "order-17"]);
      cut = 1;
      bodies.length = 0;
      const keyless = await c.enqueue("q", 1).catch((e) => e);
      assert.ok(keyless instanceof TransportError && /1 attempt/.test(keyless.message), keyless);
      assert.equal(bodies.length, 1);
    } finally {
      inDoubt.close();
    }
  });

  test("429 is retried after Retry-After, on any call", async () => {
    const limited = [429, { type: "urn:jobq:problem:too-many-waiters", title: "t", status: 429, detail: "d", instance: "/" }, { "retry-after": "0" }];
    const c = await client(limited, [201, job]);
    assert.equal((await c.enqueue("q", 1)).id, 7);
    assert.equal(seen.length, 2);
  });

  test("a refused connection is retried, even for an enqueue without a key; NO_RETRY gives up at once", async () => {
    await listening;
    const closed = createServer();
    await new Promise((resolve) => closed.listen(0, "127.0.0.1", resolve));
    const port = closed.address().port;
    closed.close();
    const started = Date.now();
    const e = await new Client(`http://127.0.0.1:${port}`, { retry: { ...QUICK, attempts: 3 } }).enqueue("q", 1).catch((x) => x);
    assert.ok(e instanceof TransportError && /3 attempt/.test(e.message), e);
    assert.ok(Date.now() - started < 5000);
    const once = await new Client(`http://127.0.0.1:${port}`, { retry: NO_RETRY }).getJob(1).catch((x) => x);
    assert.ok(once instanceof TransportError && /1 attempt/.test(once.message));
  });
});

describe("Worker against jobq", () => {
  const jobq = new Client(URL, { retry: QUICK });

  test("processes every job exactly once, completing each with its handler's result", async () => {
    const q = queueName("once");
    const n = 60;
    const jobs = await jobq.enqueueBatch(q, Array.from({ length: n }, (_, i) => ({ payload: { n: i } })));
    const calls = new Map();
    let concurrent = 0;
    let most = 0;
    const worker = new Worker(jobq, { concurrency: 4, leaseSeconds: 30, waitSeconds: 1, logger: quiet });
    worker.register(q, async (job) => {
      calls.set(job.id, (calls.get(job.id) ?? 0) + 1);
      most = Math.max(most, ++concurrent);
      await sleep(Math.random() * 10);
      concurrent--;
      return { double: job.payload.n * 2 };
    });
    const stop = running(worker);
    await until(async () => calls.size === n && worker.inFlight === 0, "every job handled");
    await stop();
    assert.ok(most <= 4, `at most 4 at once, saw ${most}`);
    for (const job of jobs) {
      assert.equal(calls.get(job.id), 1);
      const done = await jobq.getJob(job.id);
      assert.equal(done.status, "completed");
      assert.deepEqual(done.result, { double: job.payload.n * 2 });
    }
  });

  test("a thrown error fails the attempt; RetryLater picks the delay; PermanentFailure fails for good", async () => {
    const q = queueName("fail");
    const flaky = await jobq.enqueue(q, "flaky");
    const broken = await jobq.enqueue(q, "broken");
    const doomed = await jobq.enqueue(q, "doomed", { maxAttempts: 2 });
    const worker = new Worker(jobq, { concurrency: 3, waitSeconds: 0.2, logger: quiet });
    worker.register(q, (job) => {
      if (job.payload === "flaky" && job.attempts === 1) throw new RetryLater("try again", { retryIn: 0 });
      if (job.payload === "broken") throw new PermanentFailure("bad input");
      if (job.payload === "doomed") throw new Error("always");
      return "ok";
    });
    const stop = running(worker);
    await until(async () => {
      const states = await Promise.all([flaky, broken, doomed].map((j) => jobq.getJob(j.id)));
      return states[0].status === "completed" && states[1].status === "failed" && states[2].status === "failed";
    }, "the outcomes");
    await stop();
    assert.equal((await jobq.getJob(flaky.id)).attempts, 2);
    assert.equal((await jobq.getJob(broken.id)).last_error, "PermanentFailure: bad input");
    const d = await jobq.getJob(doomed.id);
    assert.equal(d.attempts, 2);
    assert.equal(d.last_error, "Error: always");
  });

  test("the worker completes and fails with minimal answers (it never reads the job they return)", async () => {
    const writes = [];
    const fetchSpy = async (url, init = {}) => {
      const response = await fetch(url, init);
      if (/\/(complete|fail)$/.test(new globalThis.URL(url).pathname)) {
        writes.push([init.headers?.prefer, response.headers.get("preference-applied")]);
      }
      return response;
    };
    const client = new Client(URL, { fetch: fetchSpy, retry: QUICK });
    const q = queueName("minimal-worker");
    const [ok, bad] = await jobq.enqueueBatch(q, [{ payload: "ok" }, { payload: "bad", maxAttempts: 1 }]);
    const worker = new Worker(client, { concurrency: 2, waitSeconds: 0.2, logger: quiet });
    worker.register(q, (job) => {
      if (job.payload === "bad") throw new PermanentFailure("no");
      return "done";
    });
    const stop = running(worker);
    await until(async () => {
      const states = await Promise.all([ok, bad].map((j) => jobq.getJob(j.id)));
      return states[0].status === "completed" && states[1].status === "failed";
    }, "both jobs finished");
    await stop();
    assert.ok(writes.length > 0);
    assert.ok(writes.every(([prefer, applied]) => prefer === "return=minimal" && applied === "return=minimal"), JSON.stringify(writes));
  });

  test("heartbeats keep a job that outlives its lease", async () => {
    const q = queueName("beats");
    const job = await jobq.enqueue(q, null);
    // A 3 s lease: a beat every second then has two to arrive in, which a loaded machine needs (with 1 s,
    // a beat later than about 0.7 s would lose the job to the sweeper).
    const worker = new Worker(jobq, { leaseSeconds: 3, waitSeconds: 0.2, logger: quiet });
    worker.register(q, async (ctx) => {
      await sleep(7500); // 2.5 leases; the test server sweeps every 0.1 s
      return ctx.attempts;
    });
    const stop = running(worker);
    await until(async () => (await jobq.getJob(job.id)).status === "completed", "completed");
    await stop();
    const done = await jobq.getJob(job.id);
    assert.equal(done.attempts, 1);
    assert.equal(done.result, 1);
  });

  test("a handler's progress shows on the running job, sent early (the next heartbeat is minutes away)", async () => {
    const q = queueName("progress");
    const job = await jobq.enqueue(q, null);
    const worker = new Worker(jobq, { leaseSeconds: 600, waitSeconds: 0.2, logger: quiet });
    let release;
    const released = new Promise((resolve) => (release = resolve));
    worker.register(q, async (ctx) => {
      for (let done = 1; done <= 3; done++) ctx.progress({ done, total: 3 });
      await released;
      return "counted";
    });
    const stop = running(worker);
    await until(async () => JSON.stringify((await jobq.getJob(job.id)).progress) === '{"done":3,"total":3}', "progress shown");
    assert.equal((await jobq.getJob(job.id)).status, "running");
    release();
    await until(async () => (await jobq.getJob(job.id)).status === "completed", "completed");
    await stop();
  });

  test("heartbeat sends progress; left out keeps it; null clears it", async () => {
    const q = queueName("beat-progress");
    const job = await jobq.enqueue(q, null);
    const [c] = await jobq.claim(q, "w");
    await jobq.heartbeat(c.id, c.claim_token, { progress: "half way" });
    assert.equal((await jobq.getJob(job.id)).progress, "half way");
    await jobq.heartbeat(c.id, c.claim_token);
    assert.equal((await jobq.getJob(job.id)).progress, "half way");
    await jobq.heartbeat(c.id, c.claim_token, { progress: null });
    assert.equal((await jobq.getJob(job.id)).progress, null);
  });

  test("stop releases a job still running after the grace period: pending again, no attempt spent", async () => {
    const q = queueName("stop");
    const job = await jobq.enqueue(q, null);
    let started = false;
    let reason;
    const worker = new Worker(jobq, { waitSeconds: 0.2, shutdownGraceSeconds: 0.3, logger: quiet });
    worker.register(q, async (ctx) => {
      started = true;
      try {
        await sleep(60_000, undefined, { signal: ctx.signal });
      } finally {
        reason = ctx.stopReason;
      }
    });
    const stop = running(worker);
    await until(() => started, "the handler to start");
    await stop();
    assert.equal(reason, "worker shutting down");
    const back = await jobq.getJob(job.id);
    assert.equal(back.status, "pending");
    assert.equal(back.attempts, 0);
  });

  test("a cancel is learned from a heartbeat: the handler's signal aborts and nothing is sent", async () => {
    const q = queueName("cancel");
    const job = await jobq.enqueue(q, null);
    let started = false;
    let reason;
    const worker = new Worker(jobq, { leaseSeconds: 3, heartbeatIntervalSeconds: 0.2, waitSeconds: 0.2, logger: quiet });
    worker.register(q, async (ctx) => {
      started = true;
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      reason = ctx.signal.reason.message;
      return "must not be sent";
    });
    const stop = running(worker);
    await until(() => started, "the handler to start");
    assert.equal((await fetch(`${URL}/jobs/${job.id}/cancel`, { method: "POST" })).status, 200);
    await until(() => reason !== undefined, "the handler to be told");
    assert.equal(reason, CANCEL_REQUESTED);
    await stop();
    const cancelled = await jobq.getJob(job.id);
    assert.equal(cancelled.status, "cancelled");
    assert.equal(cancelled.result, null);
  });

  test("a job past its timeout_seconds: the handler's signal aborts with TIMED_OUT and nothing is sent", async () => {
    const q = queueName("timeout");
    const job = await jobq.enqueue(q, null, { timeoutSeconds: 1, maxAttempts: 1 });
    assert.equal(job.timeout_seconds, 1);
    let reason;
    const worker = new Worker(jobq, { leaseSeconds: 10, heartbeatIntervalSeconds: 0.2, waitSeconds: 0.2, logger: quiet });
    worker.register(q, async (ctx) => {
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      reason = ctx.signal.reason.message;
      return "must not be sent";
    });
    const stop = running(worker);
    await until(() => reason !== undefined, "the handler to be told");
    assert.equal(reason, TIMED_OUT);
    await stop();
    const failed = await jobq.getJob(job.id);
    assert.equal(failed.status, "failed");
    assert.equal(failed.last_error, "timeout");
    assert.equal(failed.result, null);
  });

  test("a finished job's result rides on the next claim, or is completed by itself on a server without that", async () => {
    const served = await (await fetch(`${URL}/openapi.json`)).json();
    const supported = "complete" in served.components.schemas.ClaimRequest.properties;
    const q = queueName("handin");
    const jobs = await jobq.enqueueBatch(q, Array.from({ length: 8 }, (_, i) => ({ payload: i })));
    const { client, requests } = recording();
    const worker = new Worker(client, { concurrency: 1, waitSeconds: 0.5, logger: quiet });
    worker.register(q, (job) => ({ got: job.payload }));
    const stop = running(worker);
    await until(async () => (await Promise.all(jobs.map((j) => jobq.getJob(j.id)))).every((j) => j.status === "completed"), "all completed");
    await stop();
    const handedIn = requests.filter(([, path, body]) => path.endsWith("/claim") && body.complete);
    const alone = requests.filter(([, path]) => /^\/jobs\/\d+\/complete$/.test(path));
    for (const job of jobs) assert.deepEqual((await jobq.getJob(job.id)).result, { got: job.payload });
    if (supported) {
      assert.ok(handedIn.length >= 7, `completions rode on claims: ${handedIn.length}`);
      assert.ok(alone.length <= 1, `at most the last job completes by itself: ${alone.length}`);
    } else {
      assert.equal(handedIn.length, 1, "one try, answered 422, then none");
      assert.equal(alone.length, 8);
    }
  });

  test("a 422 at `complete` (a server without one request per job) turns hand-ins off for good", async () => {
    const q = queueName("old");
    const jobs = await jobq.enqueueBatch(q, Array.from({ length: 5 }, (_, i) => ({ payload: i })));
    const refusal = {
      type: "urn:jobq:problem:validation-error",
      title: "Validation failed",
      status: 422,
      detail: "body.complete: Extra inputs are not permitted",
      instance: `/queues/${q}/claim`,
      errors: [{ loc: ["body", "complete"], msg: "Extra inputs are not permitted", type: "extra_forbidden" }],
    };
    const oldServer = (_url, _init, body) =>
      body?.complete ? new Response(JSON.stringify(refusal), { status: 422, headers: { "content-type": "application/problem+json" } }) : undefined;
    const { client, requests } = recording(oldServer);
    const worker = new Worker(client, { concurrency: 1, waitSeconds: 0.5, logger: quiet });
    worker.register(q, (job) => job.payload);
    const stop = running(worker);
    await until(async () => (await Promise.all(jobs.map((j) => jobq.getJob(j.id)))).every((j) => j.status === "completed"), "all completed");
    await stop();
    assert.equal(requests.filter(([, path, body]) => path.endsWith("/claim") && body.complete).length, 1);
    assert.equal(requests.filter(([, path]) => /^\/jobs\/\d+\/complete$/.test(path)).length, 5);
  });

  test("a claim refused for good (a bad queue name) stops run() with the error", async () => {
    const worker = new Worker(jobq, { waitSeconds: 0, logger: quiet });
    worker.register("no spaces allowed", () => null);
    await assert.rejects(worker.run({ handleSignals: false }), ValidationError);
  });
});
