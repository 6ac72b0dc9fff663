#!/usr/bin/env node
// A jobq worker in plain Node.js 20: built-in fetch, no dependencies. It long-polls one queue, runs
// `handle()` for each job while heartbeating its lease, then completes or fails the job with its claim
// token. Replace `handle()` with your work; the rest is the protocol (docs/workers.md).
//
//   JOBQ_URL=http://127.0.0.1:8000 node examples/node-worker.mjs emails
//
// Environment: JOBQ_URL, JOBQ_API_KEY (sent as a Bearer token), JOBQ_WORKER (name, default host-pid),
// JOBQ_CONCURRENCY (jobs claimed and run at once, default 4), JOBQ_LEASE_SECONDS (default 30),
// JOBQ_WAIT_SECONDS (long-poll, default 20), JOBQ_EXIT_WHEN_IDLE=1 (exit once a claim comes back
// empty: batch runs and tests). SIGTERM/SIGINT: claim nothing more, finish the jobs in hand, exit.

import os from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

const QUEUE = process.argv[2];
if (!QUEUE) {
  console.error("usage: node node-worker.mjs QUEUE");
  process.exit(2);
}
const BASE = (process.env.JOBQ_URL ?? "http://127.0.0.1:8000").replace(/\/+$/, "");
const WORKER = process.env.JOBQ_WORKER ?? `${os.hostname()}-${process.pid}`;
const CONCURRENCY = Number(process.env.JOBQ_CONCURRENCY ?? 4);
const LEASE = Number(process.env.JOBQ_LEASE_SECONDS ?? 30);
const WAIT = Number(process.env.JOBQ_WAIT_SECONDS ?? 20);
const EXIT_WHEN_IDLE = process.env.JOBQ_EXIT_WHEN_IDLE === "1";
const HEARTBEAT_MS = (LEASE * 1000) / 3; // a third of the lease: two beats may fail before it lapses

// --- the work: replace this -------------------------------------------------------------------------

// `signal` aborts when the job is no longer ours (claim lost, job cancelled): stop, nothing is sent.
// Return a JSON value to complete the job. Throw to fail the attempt: `err.retryInSeconds` picks the
// retry delay, `err.retry = false` fails the job for good.
async function handle(job, signal) {
  const p = job.payload ?? {};
  if (p.sleep_seconds) await sleep(p.sleep_seconds * 1000, undefined, { signal });
  if (p.fail && job.attempts <= (p.fail_attempts ?? Infinity)) {
    const err = new Error(p.fail);
    err.retry = p.retry ?? true;
    err.retryInSeconds = p.retry_in_seconds;
    throw err;
  }
  return { handled_by: WORKER, attempt: job.attempts, echo: p };
}

// --- the protocol -----------------------------------------------------------------------------------

class Problem extends Error {
  constructor(status, doc) {
    super(`${status} ${doc.type ?? ""}: ${doc.detail ?? ""}`);
    this.status = status;
    this.type = doc.type ?? "about:blank";
  }
}

const headers = { "content-type": "application/json", accept: "application/json" };
if (process.env.JOBQ_API_KEY) headers.authorization = `Bearer ${process.env.JOBQ_API_KEY}`;

// POST with retries on no answer, 429 and 503 (Retry-After honoured). Every call this worker makes is
// safe to repeat: heartbeat/complete/fail with the same token answer 200 again, and a claim whose
// answer was lost only leaves its jobs claimed until their lease lapses.
async function post(path, body, { signal, waitSeconds = 0 } = {}) {
  for (let attempt = 1; ; attempt++) {
    let res;
    try {
      const timeout = AbortSignal.timeout((waitSeconds + 10) * 1000);
      res = await fetch(BASE + path, {
        method: "POST",
        headers,
        body: JSON.stringify(body),
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
      });
    } catch (err) {
      if (signal?.aborted || attempt >= 5) throw err;
      await sleep(Math.random() * Math.min(10_000, 200 * 2 ** attempt));
      continue;
    }
    if (res.ok) return res.json();
    const doc = await res.json().catch(() => ({}));
    if ((res.status === 429 || res.status === 503) && attempt < 5) {
      const after = Number(res.headers.get("retry-after"));
      await sleep(Number.isFinite(after) && after > 0 ? after * 1000 : 200 * 2 ** attempt);
      continue;
    }
    throw new Problem(res.status, doc);
  }
}

// Any 409 (claim-lost, job-cancelled, invalid-state) or 404 means the job is no longer ours.
const lostClaim = (err) => err instanceof Problem && (err.status === 409 || err.status === 404);

async function run(job) {
  console.log(`job ${job.id}: attempt ${job.attempts} of ${job.max_attempts}`);
  const lost = new AbortController();
  let beating = true;
  let timer;
  // One heartbeat at a time: the next is scheduled when this one has answered.
  const beat = async () => {
    try {
      const hb = await post(`/jobs/${job.id}/heartbeat`, { claim_token: job.claim_token });
      if (hb.cancel_requested) lost.abort(new Error("cancel requested"));
    } catch (err) {
      if (lostClaim(err)) lost.abort(err);
      else console.warn(`job ${job.id}: heartbeat failed (${err.message}); trying again`);
    }
    if (beating && !lost.signal.aborted) timer = setTimeout(beat, HEARTBEAT_MS);
  };
  timer = setTimeout(beat, HEARTBEAT_MS);
  let outcome;
  try {
    outcome = { result: await handle(job, lost.signal) };
  } catch (err) {
    outcome = { err };
  } finally {
    beating = false;
    clearTimeout(timer);
  }
  if (lost.signal.aborted) {
    console.warn(`job ${job.id}: no longer ours (${lost.signal.reason?.message}); not completing it`);
    return;
  }
  const token = job.claim_token;
  try {
    if ("result" in outcome) {
      await post(`/jobs/${job.id}/complete`, { claim_token: token, result: outcome.result ?? null });
      console.log(`job ${job.id}: completed`);
    } else {
      const { err } = outcome;
      const body = { claim_token: token, error: `${err.name}: ${err.message}`.slice(0, 4000) };
      if (err.retry === false) body.retry = false;
      if (typeof err.retryInSeconds === "number") body.retry_in_seconds = err.retryInSeconds;
      const after = await post(`/jobs/${job.id}/fail`, body);
      console.log(`job ${job.id}: attempt ${job.attempts} failed (${body.error}); now ${after.status}`);
    }
  } catch (err) {
    // 409: the lease lapsed and the job went to someone else. Otherwise the lease will lapse and the
    // job will run again: at-least-once, which is why handlers must be idempotent.
    console.warn(`job ${job.id}: outcome not recorded (${err.message})`);
  }
}

let stopping = false;
const stopClaiming = new AbortController();
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    if (stopping) process.exit(1); // a second signal: give up now; the leases will lapse
    console.log(`${sig}: finishing the jobs in hand, claiming no more`);
    stopping = true;
    stopClaiming.abort(); // the server releases what it claimed for a request that went away
  });
}

console.log(`worker ${WORKER} on ${BASE}, queue ${QUEUE}`);
const running = new Set();
while (!stopping) {
  if (running.size >= CONCURRENCY) {
    await Promise.race(running); // a slot frees up
    continue;
  }
  let jobs;
  try {
    ({ jobs } = await post(
      `/queues/${encodeURIComponent(QUEUE)}/claim`,
      { worker: WORKER, limit: CONCURRENCY - running.size, lease_seconds: LEASE, wait_seconds: WAIT },
      { signal: stopClaiming.signal, waitSeconds: WAIT },
    ));
  } catch (err) {
    if (stopping) break;
    if (err instanceof Problem && err.status >= 400 && err.status < 500) {
      console.error(`claim refused: ${err.message}`); // a bad key, queue name or setting: fix and restart
      process.exit(1);
    }
    console.warn(`claim failed (${err.message}); trying again`);
    await sleep(1000);
    continue;
  }
  for (const job of jobs) {
    const done = run(job).finally(() => running.delete(done));
    running.add(done);
  }
  if (jobs.length === 0 && running.size === 0 && EXIT_WHEN_IDLE) break;
}
await Promise.all(running);
console.log("stopped");
