#!/usr/bin/env node
// A jobq worker in Node.js 20 on the TypeScript SDK (clients/typescript, `@jobq/client`): it long-polls one
// queue, runs `handle()` for each job while heartbeating its lease, then completes or fails the job. Replace
// `handle()` with your work; the SDK does the protocol (docs/workers.md).
//
//   (cd clients/typescript && npm ci && npm run build)   # once, in a jobq checkout
//   JOBQ_URL=http://127.0.0.1:8000 node examples/node-worker.mjs emails
//
// Environment: JOBQ_URL, JOBQ_API_KEY (sent as a Bearer token), JOBQ_WORKER (name, default host-pid),
// JOBQ_CONCURRENCY (jobs run at once, default 4), JOBQ_LEASE_SECONDS (default 30), JOBQ_WAIT_SECONDS
// (long-poll, default 20), JOBQ_EXIT_WHEN_IDLE=1 (exit once a claim comes back empty with nothing
// running: batch runs and tests). SIGTERM/SIGINT: claim nothing more, finish the jobs in hand, exit.

import { setTimeout as sleep } from "node:timers/promises";

// In your own project: import { PermanentFailure, RetryLater, Worker } from "@jobq/client";
import { PermanentFailure, RetryLater, Worker } from "../clients/typescript/dist/index.js";

const QUEUE = process.argv[2];
if (!QUEUE) {
  console.error("usage: node node-worker.mjs QUEUE");
  process.exit(2);
}
const env = process.env;

const worker = new Worker(env.JOBQ_URL ?? "http://127.0.0.1:8000", {
  apiKey: env.JOBQ_API_KEY,
  ...(env.JOBQ_WORKER ? { name: env.JOBQ_WORKER } : {}),
  concurrency: Number(env.JOBQ_CONCURRENCY ?? 4),
  leaseSeconds: Number(env.JOBQ_LEASE_SECONDS ?? 30),
  waitSeconds: Number(env.JOBQ_WAIT_SECONDS ?? 20),
  logger: console,
  onIdle: env.JOBQ_EXIT_WHEN_IDLE === "1" ? () => worker.stop() : undefined,
});

// --- the work: replace this -------------------------------------------------------------------------

// `job.signal` aborts when the job is no longer ours (claim lost, job cancelled, the worker stopping):
// stop, nothing is sent. Return a JSON value to complete the job. Throw to fail the attempt: RetryLater
// picks the retry delay, PermanentFailure fails the job for good, anything else is retried with backoff.
async function handle(job) {
  console.log(`job ${job.id}: attempt ${job.attempts} of ${job.maxAttempts}`);
  const p = job.payload ?? {};
  if (p.sleep_seconds) await sleep(p.sleep_seconds * 1000, undefined, { signal: job.signal });
  if (p.fail && job.attempts <= (p.fail_attempts ?? Infinity)) {
    if (p.retry === false) throw new PermanentFailure(p.fail);
    if (typeof p.retry_in_seconds === "number") throw new RetryLater(p.fail, { retryIn: p.retry_in_seconds });
    throw new Error(p.fail);
  }
  return { handled_by: worker.name, attempt: job.attempts, echo: p };
}

// --- run ----------------------------------------------------------------------------------------------

worker.register(QUEUE, handle);
console.log(`worker ${worker.name} on ${env.JOBQ_URL ?? "http://127.0.0.1:8000"}, queue ${QUEUE}`);
await worker.run(); // SIGTERM/SIGINT handled: a first one finishes the jobs in hand, a second releases them
console.log("stopped");
