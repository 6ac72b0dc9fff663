// Client: one method per API call, bodies and answers typed by the committed OpenAPI document
// (src/openapi.ts, generated from openapi/openapi.json), problem answers as typed errors, and retries
// where a retry is safe: the same decisions as the Python SDK (jobq_client/_calls.py).

import { JobqError, RateLimited, ServerError, TransportError, WaitTimeout, errorFromAnswer } from "./errors.js";
import type { components } from "./openapi.js";
import { hostname } from "node:os";

// This machine's name as the User-Agent carries it: the characters a host name may hold, nothing else.
const HOST = hostname().replace(/[^A-Za-z0-9._:-]/g, "-").slice(0, 255) || "unknown";

type Schemas = components["schemas"];
export type Job = Schemas["Job"];
export type Claim = Schemas["Claim"];
export type Heartbeat = Schemas["HeartbeatResponse"];
export type CompleteOutcome = Schemas["CompleteOutcome"];
export type JobStatus = Schemas["Status"];
export type QueueStats = Schemas["QueueStats"];
export type EnqueueRequest = Schemas["EnqueueRequest"];
export type ClaimRequest = Schemas["ClaimRequest"];
export type CompleteItem = Schemas["CompleteItem"];
/** A unique job's options: at most one job per key on the queue (docs/producers.md); `while` must include pending and running. */
export type UniqueOptions = Schemas["UniqueOptions"];
/** A unique job's key and window, as the server shows them on the job (`job.unique`). */
export type JobUnique = Schemas["JobUnique"];
/** A debounced enqueue's options: replace the key's pending job instead of making another (docs/producers.md). */
export type DebounceOptions = Schemas["DebounceOptions"];
/** A debounced job's key and options, as the server shows them on the job (`job.debounce`). */
export type JobDebounce = Schemas["JobDebounce"];
/** What an enqueue did: made the job, found it (idempotency or unique key), or replaced it (debounce). */
export type EnqueueOutcome = "created" | "existing" | "replaced";
/** A job as an enqueue answers it, with what the enqueue did (absent from a server older than this). */
export type EnqueuedJob = Job & { enqueued?: EnqueueOutcome };
/** A job's id and status after a complete or fail: their answer with `{ minimal: true }`. */
export type JobState = Schemas["JobState"];
/**
 * An enqueued job's id and status: what enqueue and enqueueBatch answer with `{ minimal: true }`. `created`
 * is false when the idempotency key already named the job (nothing was written); null when the server did
 * not say (one without minimal answers, in a batch).
 */
export interface Enqueued {
  id: number;
  status: JobStatus;
  created: boolean | null;
  /** What the enqueue did (created, existing, replaced); absent when the server did not say. */
  enqueued?: EnqueueOutcome;
}
/** `minimal: true` asks for ids and states only (`Prefer: return=minimal`): the server skips the whole job. */
export interface MinimalOption {
  minimal?: boolean;
}
/** A dependency: a job id; in a batch also an earlier item, by its `ref` or as `{ ref: index }`. */
export type Dependency = number | string | Schemas["BatchRef"];

export const VERSION = "0.1.0";
export const DEFAULT_TIMEOUT_SECONDS = 10;
/** How long one request of wait() waits on the server (its longest is JOBQ_WAIT_MAX_SECONDS, 30 by default). */
export const WAIT_CHUNK_SECONDS = 20;
const FINISHED: ReadonlySet<string> = new Set(["completed", "failed", "cancelled"]);

/** completed, failed or cancelled: the job will not run again (unless an operator retries it). */
export function finished(job: Job): boolean {
  return FINISHED.has(job.status);
}

export interface WaitOptions {
  /** Give up after this many seconds with a WaitTimeout (holding the job as it was); default: wait as long as it takes. */
  timeoutSeconds?: number | undefined;
  /** Abort the wait (no retry then). */
  signal?: AbortSignal | undefined;
}

/** One job of an enqueue: the payload and the optional fields, in this client's spelling. */
export interface NewJob {
  payload: unknown;
  priority?: number;
  /** Earliest start: a Date, or an RFC 3339 string with an offset. */
  runAt?: Date | string;
  /** Earliest start, relative to now. */
  delaySeconds?: number;
  maxAttempts?: number;
  /** A repeat on the same queue returns the existing job. With one, enqueue is retried on any transient failure. */
  idempotencyKey?: string;
  /** Runs once these jobs have completed: job ids, or (in a batch) earlier items by `ref` or `{ ref: index }`. */
  dependsOn?: Dependency[];
  /** When a dependency fails or is cancelled: "cancel" (the server's default) or "run" anyway. */
  onDependencyFailure?: "cancel" | "run";
  /** This item's name, by which later items of the same batch name it in `dependsOn`. */
  ref?: string;
  /** Hard timeout: a claim that runs this long is failed by the server ("timeout"), heartbeats or not. */
  timeoutSeconds?: number;
  /**
   * At most one such job: while a job with `key` (default: a hash of the payload) is in a `while` state
   * (default pending, running, completed), and with `for_seconds` in the same aligned window, enqueue returns it.
   */
  unique?: UniqueOptions;
  /**
   * While a job with `key` is pending, replace its payload and priority and move its run time to now + `seconds`
   * (never past its first enqueue + `max_wait_seconds`, never earlier) instead of making a new job.
   */
  debounce?: DebounceOptions;
}

/** One job to complete in a batch (`completeMany`) or on a claim (`claim` with `complete`). */
export interface Completion {
  id: number;
  claimToken: string;
  result?: unknown;
}

/** The answer of a claim that also completed jobs: the claimed jobs, and one outcome per completion. */
export interface ClaimAnswer {
  jobs: Claim[];
  completed: CompleteOutcome[];
}

/**
 * Retries for connection errors, 429 and 502/503/504, on the calls where a retry is safe.
 *
 * `attempts` counts every try, the first included (1 = never retry). Without a Retry-After header the
 * wait is exponential with full jitter: uniform(0, min(backoffMax, backoffBase * 2 ** n)) seconds. A
 * Retry-After header is honoured, up to `retryAfterMax` seconds.
 */
export interface RetryPolicy {
  attempts: number;
  backoffBase: number;
  backoffMax: number;
  retryAfterMax: number;
}

export const DEFAULT_RETRY: RetryPolicy = Object.freeze({
  attempts: 5,
  backoffBase: 0.2,
  backoffMax: 10,
  retryAfterMax: 60,
});
export const NO_RETRY: RetryPolicy = Object.freeze({ ...DEFAULT_RETRY, attempts: 1 });

/** Seconds to wait after try number `attempt` (1-based) failed. */
export function backoff(policy: RetryPolicy, attempt: number, retryAfter?: number): number {
  if (retryAfter !== undefined) return Math.min(Math.max(retryAfter, 0), policy.retryAfterMax);
  return Math.random() * Math.min(policy.backoffMax, policy.backoffBase * 2 ** (attempt - 1));
}

/** When a call may be sent again. */
export enum Safety {
  // Repeating it changes nothing (reads; heartbeat, complete and fail with the same token; release, whose
  // repeat gets 409 claim-lost since the first ended the claim), or the worst a repeat does is acceptable
  // (claim: a lost answer leaves jobs claimed until their lease lapses, then the sweeper hands them out
  // again).
  Repeatable = "repeatable",
  // Only when the server cannot have acted on it: the connection was never made, or a 429, which refuses
  // the request before any work. (Enqueue without an idempotency key: a 503 may come after the INSERT
  // committed, and a repeat would create a second job.)
  UnsentOnly = "unsent-only",
}

// Codes of errors raised before the request left this host: a repeat cannot duplicate anything.
const UNSENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

function unsent(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && UNSENT.has(code)) return true;
    const errors = (e as { errors?: unknown }).errors; // AggregateError: every address refused
    if (Array.isArray(errors) && errors.length > 0 && errors.every(unsent)) return true;
  }
  return false;
}

interface Call<T> {
  operation: string; // the OpenAPI operationId, for logs
  method: "GET" | "POST";
  path: string;
  body?: unknown;
  safety: Safety;
  parse: (doc: unknown, status: number, headers: Headers) => T;
  longPoll?: number; // seconds the server may hold the request before it answers
  headers?: Record<string, string>; // sent besides the client's own
  signal?: AbortSignal | undefined; // the caller's: abort the call (no retry then)
}

export interface ClientOptions {
  /** Sent as `Authorization: Bearer <key>`. */
  apiKey?: string | undefined;
  /** Seconds to wait for an answer, on top of a long-poll's wait. */
  timeoutSeconds?: number;
  /** How often and how long to retry where that is safe (NO_RETRY turns retries off). */
  retry?: Partial<RetryPolicy> | undefined;
  /** Called before each retry. */
  onRetry?: (operation: string, attempt: number, why: string, delaySeconds: number) => void;
  /** Your own fetch (a proxy agent, tests); the global one by default. */
  fetch?: typeof fetch;
}

/** Sleep, waking early (with the signal's reason) when the signal aborts. */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(done, seconds * 1000);
    function done(): void {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }
    function aborted(): void {
      clearTimeout(timer);
      reject(signal?.reason);
    }
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

function object(doc: unknown, key: string): unknown {
  if (doc === null || typeof doc !== "object" || !(key in doc)) throw new TypeError(`no "${key}" in the answer`);
  return (doc as Record<string, unknown>)[key];
}

function list<T>(doc: unknown, key: string): T[] {
  const found = object(doc, key);
  if (!Array.isArray(found)) throw new TypeError(`"${key}" is not a list`);
  return found as T[];
}

const asJob = (doc: unknown): Job => {
  object(doc, "id");
  return doc as Job;
};

// Ids and states only (RFC 7240). A server without minimal answers ignores the header and sends the whole
// job, which these parsers read alike.
const MINIMAL = { prefer: "return=minimal" };

function asState(doc: unknown): JobState {
  return { id: object(doc, "id") as number, status: object(doc, "status") as JobStatus };
}

function asEnqueued(doc: unknown, created: boolean | null): Enqueued {
  const said = (doc as { created?: unknown; enqueued?: EnqueueOutcome }).created;
  const enqueued = (doc as { enqueued?: EnqueueOutcome }).enqueued;
  const state = { ...asState(doc), created: typeof said === "boolean" ? said : created };
  return enqueued === undefined ? state : { ...state, enqueued };
}

function timestamp(value: Date | string): string {
  return value instanceof Date ? value.toISOString() : value;
}

/** @internal A job as the HTTP enqueue's body (and a batch item: also what `enqueue_batch` reads in SQL). */
export function jobBody(job: NewJob): EnqueueRequest {
  const body: EnqueueRequest = { payload: job.payload };
  if (job.priority !== undefined) body.priority = job.priority;
  if (job.runAt !== undefined) body.run_at = timestamp(job.runAt);
  if (job.delaySeconds !== undefined) body.delay_seconds = job.delaySeconds;
  if (job.maxAttempts !== undefined) body.max_attempts = job.maxAttempts;
  if (job.idempotencyKey !== undefined) body.idempotency_key = job.idempotencyKey;
  if (job.dependsOn !== undefined) body.depends_on = job.dependsOn;
  if (job.onDependencyFailure !== undefined) body.on_dependency_failure = job.onDependencyFailure;
  if (job.ref !== undefined) body.ref = job.ref;
  if (job.timeoutSeconds !== undefined) body.timeout_seconds = job.timeoutSeconds;
  if (job.unique !== undefined) body.unique = job.unique;
  if (job.debounce !== undefined) body.debounce = job.debounce;
  return body;
}

function completeItem(c: Completion): CompleteItem {
  return { id: c.id, claim_token: c.claimToken, result: c.result ?? null };
}

function queuePath(queue: string): string {
  return `/queues/${encodeURIComponent(queue).replaceAll("%3A", ":")}`;
}

function jobPath(id: number): string {
  if (!Number.isSafeInteger(id) || id < 1) throw new RangeError(`job ids are positive integers, not ${id}`);
  return `/jobs/${id}`;
}

/**
 * A client for one jobq service. Reuse one per process: it holds no connection of its own (fetch pools
 * them). Calls that are safe to repeat are retried on connection errors, 429 and 502/503/504 (see
 * RetryPolicy); an enqueue only with an idempotency key, or when it cannot have reached the server.
 */
export class Client {
  readonly baseUrl: string;
  readonly timeoutSeconds: number;
  readonly retry: RetryPolicy;
  /** Seconds one request of wait() waits on the server. */
  waitChunkSeconds = WAIT_CHUNK_SECONDS;
  private readonly headers: Record<string, string>;
  private readonly fetch: typeof fetch;
  private readonly onRetry: ClientOptions["onRetry"];

  constructor(baseUrl = "http://127.0.0.1:8000", options: ClientOptions = {}) {
    if (!/^https?:\/\//.test(baseUrl)) throw new TypeError(`baseUrl must be an http(s) URL, not ${baseUrl}`);
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeoutSeconds = options.timeoutSeconds ?? DEFAULT_TIMEOUT_SECONDS;
    this.retry = { ...DEFAULT_RETRY, ...options.retry };
    if (!(this.retry.attempts >= 1)) throw new RangeError("retry.attempts counts the first try too: at least 1");
    this.fetch = options.fetch ?? globalThis.fetch;
    this.onRetry = options.onRetry;
    this.headers = {
      accept: "application/json, application/problem+json",
      // The host rides in a comment: jobq's worker registry shows it (GET /workers).
      "user-agent": `jobq-client-typescript/${VERSION} (host=${HOST})`,
    };
    if (options.apiKey) this.headers["authorization"] = `Bearer ${options.apiKey}`;
  }

  // -- producers ------------------------------------------------------------------------------------------

  /**
   * Add a job. Retried on any transient failure with an idempotency key; without one only when it cannot have
   * arrived. With `minimal: true` the answer is the job's id and status only (Enqueued).
   */
  enqueue(queue: string, payload: unknown, options?: Omit<NewJob, "payload"> & { minimal?: false }): Promise<EnqueuedJob>;
  enqueue(queue: string, payload: unknown, options: Omit<NewJob, "payload"> & { minimal: true }): Promise<Enqueued>;
  enqueue(queue: string, payload: unknown, options?: Omit<NewJob, "payload"> & MinimalOption): Promise<EnqueuedJob | Enqueued>;
  enqueue(queue: string, payload: unknown, options: Omit<NewJob, "payload"> & MinimalOption = {}): Promise<EnqueuedJob | Enqueued> {
    const { minimal, ...job } = options;
    const body = jobBody({ ...job, payload });
    const safety = body.idempotency_key !== undefined ? Safety.Repeatable : Safety.UnsentOnly;
    const call = { operation: "enqueueJob", method: "POST" as const, path: `${queuePath(queue)}/jobs`, body, safety };
    if (minimal) return this.send({ ...call, parse: (doc, status) => asEnqueued(doc, status === 201), headers: MINIMAL });
    const parse = (doc: unknown, _status: number, headers: Headers): EnqueuedJob => {
      const enqueued = headers.get("jobq-enqueued");
      return enqueued === null ? asJob(doc) : { ...asJob(doc), enqueued: enqueued as EnqueueOutcome };
    };
    return this.send({ ...call, parse });
  }

  /**
   * Add several jobs, all or nothing, in order. Retried like enqueue when every job has a key. With
   * `minimal: true`, each job's id and status only (Enqueued), in order.
   */
  enqueueBatch(queue: string, jobs: NewJob[], options?: { minimal?: false }): Promise<EnqueuedJob[]>;
  enqueueBatch(queue: string, jobs: NewJob[], options: { minimal: true }): Promise<Enqueued[]>;
  enqueueBatch(queue: string, jobs: NewJob[], options?: MinimalOption): Promise<EnqueuedJob[] | Enqueued[]>;
  enqueueBatch(queue: string, jobs: NewJob[], options: MinimalOption = {}): Promise<EnqueuedJob[] | Enqueued[]> {
    const docs = jobs.map(jobBody);
    const keyed = docs.length > 0 && docs.every((d) => d.idempotency_key !== undefined);
    const call = {
      operation: "enqueueJobs",
      method: "POST" as const,
      path: `${queuePath(queue)}/jobs/batch`,
      body: { jobs: docs },
      safety: keyed ? Safety.Repeatable : Safety.UnsentOnly,
    };
    if (options.minimal) {
      return this.send({ ...call, parse: (doc) => list<unknown>(doc, "jobs").map((j) => asEnqueued(j, null)), headers: MINIMAL });
    }
    const parse = (doc: unknown): EnqueuedJob[] => {
      const jobs = list<Job>(doc, "jobs");
      const outcomes = (doc as { enqueued?: EnqueueOutcome[] }).enqueued;
      return outcomes === undefined ? jobs : jobs.map((job, i) => ({ ...job, enqueued: outcomes[i] as EnqueueOutcome }));
    };
    return this.send({ ...call, parse });
  }

  // -- workers ----------------------------------------------------------------------------------------------

  /** Claim up to `limit` jobs, waiting up to `waitSeconds` for one; [] when none came. `signal` aborts a long-poll. */
  async claim(queue: string, worker: string, options: ClaimOptions = {}): Promise<Claim[]> {
    return (await this.claimAndComplete(queue, worker, [], options)).jobs;
  }

  /**
   * Complete `complete` (at most the server's JOBQ_MAX_BATCH_COMPLETE items), then claim, in one request:
   * one outcome per completion, in order. A server older than this contract answers 422 with errors at
   * `body.complete` (ValidationError); complete those jobs by themselves then.
   */
  claimAndComplete(queue: string, worker: string, complete: Completion[], options: ClaimOptions = {}): Promise<ClaimAnswer> {
    const body: ClaimRequest = { worker, limit: options.limit ?? 1 };
    if (options.leaseSeconds !== undefined) body.lease_seconds = options.leaseSeconds;
    if (options.waitSeconds !== undefined) body.wait_seconds = options.waitSeconds;
    if (complete.length > 0) body.complete = complete.map(completeItem);
    return this.send({
      operation: "claimJobs",
      method: "POST",
      path: `${queuePath(queue)}/claim`,
      body,
      safety: Safety.Repeatable,
      parse: (doc) => {
        const jobs = list<Claim>(doc, "jobs");
        const completed = complete.length > 0 ? list<CompleteOutcome>(doc, "completed") : [];
        if (completed.length !== complete.length) throw new TypeError("not one outcome per completion");
        return { jobs, completed };
      },
      longPoll: options.waitSeconds ?? 0,
      signal: options.signal,
    });
  }

  /**
   * Extend the lease (by the claim's lease unless `leaseSeconds`). ClaimLost: stop working. `progress` (any
   * JSON value; null clears it) is shown on the job until its next claim; left out, it stays as it is.
   */
  heartbeat(id: number, claimToken: string, options: { leaseSeconds?: number; progress?: unknown } = {}): Promise<Heartbeat> {
    const body: Schemas["HeartbeatRequest"] = { claim_token: claimToken };
    if (options.leaseSeconds !== undefined) body.lease_seconds = options.leaseSeconds;
    if ("progress" in options) body.progress = options.progress === undefined ? null : options.progress;
    return this.send({
      operation: "heartbeatJob",
      method: "POST",
      path: `${jobPath(id)}/heartbeat`,
      body,
      safety: Safety.Repeatable,
      parse: (doc) => {
        object(doc, "cancel_requested");
        return doc as Heartbeat;
      },
    });
  }

  /**
   * Complete a claimed job with `result` (default null). A repeat with the same token answers the job again.
   * With `minimal: true` the answer is its id and status only (JobState).
   */
  complete(id: number, claimToken: string, result?: unknown, options?: { minimal?: false }): Promise<Job>;
  complete(id: number, claimToken: string, result: unknown, options: { minimal: true }): Promise<JobState>;
  complete(id: number, claimToken: string, result?: unknown, options?: MinimalOption): Promise<Job | JobState>;
  complete(id: number, claimToken: string, result: unknown = null, options: MinimalOption = {}): Promise<Job | JobState> {
    const body: Schemas["CompleteRequest"] = { claim_token: claimToken, result };
    const call = { operation: "completeJob", method: "POST" as const, path: `${jobPath(id)}/complete`, body, safety: Safety.Repeatable };
    if (options.minimal) return this.send({ ...call, parse: asState, headers: MINIMAL });
    return this.send({ ...call, parse: asJob });
  }

  /** Complete several jobs in one request; each gets its own outcome, in order. */
  completeMany(items: Completion[]): Promise<CompleteOutcome[]> {
    const body: Schemas["CompleteBatchRequest"] = { jobs: items.map(completeItem) };
    return this.send({
      operation: "completeJobs",
      method: "POST",
      path: "/jobs/complete",
      body,
      safety: Safety.Repeatable,
      parse: (doc) => list<CompleteOutcome>(doc, "results"),
    });
  }

  /**
   * Record a failed attempt: retried later (after `retryInSeconds`, else the server's backoff) while
   * attempts remain, or failed for good now with `retry: false`. With `minimal: true` the answer is the
   * job's id and status only (JobState): `pending` (to be retried) or `failed`.
   */
  fail(id: number, claimToken: string, error: string, options?: FailOptions & { minimal?: false }): Promise<Job>;
  fail(id: number, claimToken: string, error: string, options: FailOptions & { minimal: true }): Promise<JobState>;
  fail(id: number, claimToken: string, error: string, options?: FailOptions & MinimalOption): Promise<Job | JobState>;
  fail(id: number, claimToken: string, error: string, options: FailOptions & MinimalOption = {}): Promise<Job | JobState> {
    const body: Schemas["FailRequest"] = { claim_token: claimToken, error };
    if (options.retryInSeconds !== undefined) body.retry_in_seconds = options.retryInSeconds;
    if (options.retry === false) body.retry = false;
    const call = { operation: "failJob", method: "POST" as const, path: `${jobPath(id)}/fail`, body, safety: Safety.Repeatable };
    if (options.minimal) return this.send({ ...call, parse: asState, headers: MINIMAL });
    return this.send({ ...call, parse: asJob });
  }

  /**
   * Hand a claimed job back untried (shutting down, a resource missing right now): pending again,
   * claimable after `delaySeconds`, and the claim's attempt is not counted. Use fail() for a job that was
   * tried. The claim ends: a repeat, like any later call with this token, throws ClaimLost.
   */
  release(id: number, claimToken: string, options: { delaySeconds?: number } = {}): Promise<Job> {
    const body: Schemas["ReleaseRequest"] = { claim_token: claimToken, delay_seconds: options.delaySeconds ?? 0 };
    return this.send({ operation: "releaseJob", method: "POST", path: `${jobPath(id)}/release`, body, safety: Safety.Repeatable, parse: asJob });
  }

  // -- operators --------------------------------------------------------------------------------------------

  getJob(id: number): Promise<Job> {
    return this.send({ operation: "getJob", method: "GET", path: jobPath(id), safety: Safety.Repeatable, parse: asJob });
  }

  /**
   * The job once it has finished (completed, failed or cancelled: look at `status`, `result`,
   * `last_error`). The server holds each request until the job finishes (up to `waitChunkSeconds`, holding
   * no database connection) and answers as it does: no polling. Throws WaitTimeout, with the job as it was,
   * when `timeoutSeconds` pass first.
   */
  async wait(id: number, options: WaitOptions = {}): Promise<Job> {
    const deadline = options.timeoutSeconds === undefined ? undefined : Date.now() + options.timeoutSeconds * 1000;
    for (;;) {
      const left = deadline === undefined ? this.waitChunkSeconds : Math.max(0, (deadline - Date.now()) / 1000);
      const waitSeconds = Math.min(this.waitChunkSeconds, left);
      const job = await this.send({
        operation: "getJob",
        method: "GET",
        path: waitSeconds > 0 ? `${jobPath(id)}?wait_seconds=${waitSeconds}` : jobPath(id),
        safety: Safety.Repeatable,
        parse: asJob,
        longPoll: waitSeconds,
        signal: options.signal,
      });
      if (finished(job)) return job;
      if (deadline !== undefined && Date.now() >= deadline) throw new WaitTimeout(job);
    }
  }

  /**
   * enqueue() then wait(): the job once a worker has finished it. With an `idempotencyKey`, calling this
   * again after a failure waits for the same job rather than making a second one.
   */
  async enqueueAndWait(queue: string, payload: unknown, options: Omit<NewJob, "payload"> & WaitOptions = {}): Promise<Job> {
    const { timeoutSeconds, signal, ...job } = options;
    const enqueued = await this.enqueue(queue, payload, { ...job, minimal: true }); // only its id is read
    return this.wait(enqueued.id, { timeoutSeconds, signal });
  }

  /** `GET /queues/{queue}/stats`. */
  stats(queue: string): Promise<QueueStats> {
    return this.send({
      operation: "getQueueStats",
      method: "GET",
      path: `${queuePath(queue)}/stats`,
      safety: Safety.Repeatable,
      parse: (doc) => {
        object(doc, "counts");
        return doc as QueueStats;
      },
    });
  }

  // -- the one place requests are made ----------------------------------------------------------------------

  private async send<T>(call: Call<T>): Promise<T> {
    // Strict JSON, as the server wants it: a lone surrogate or a number JSON cannot hold is refused here.
    const body = call.body === undefined ? undefined : encode(call.body);
    const headers = { ...this.headers, ...(body === undefined ? {} : { "content-type": "application/json" }), ...call.headers };
    for (let attempt = 1; ; attempt++) {
      call.signal?.throwIfAborted();
      // AbortSignal.timeout takes whole milliseconds only (a RangeError otherwise), and a long-poll's
      // remaining wait is fractional.
      const timeout = AbortSignal.timeout(Math.ceil((this.timeoutSeconds + (call.longPoll ?? 0)) * 1000));
      let response: Response;
      let text: string;
      try {
        response = await this.fetch(this.baseUrl + call.path, {
          method: call.method,
          headers,
          ...(body === undefined ? {} : { body }),
          signal: call.signal ? AbortSignal.any([call.signal, timeout]) : timeout,
        });
        text = await response.text();
      } catch (error) {
        if (call.signal?.aborted) throw call.signal.reason;
        const retryable = call.safety === Safety.Repeatable || unsent(error);
        if (!retryable || attempt >= this.retry.attempts) {
          const why = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
          throw new TransportError(`${call.method} ${call.path}: no answer after ${attempt} attempt(s) (${why})`, { cause: error });
        }
        await this.pause(call, attempt, error instanceof Error ? error.name : "no answer", backoff(this.retry, attempt));
        continue;
      }
      const answer = this.answer(call, response, text);
      if (!(answer instanceof JobqError)) return answer.value;
      const delay = this.retryAfterAnswer(call, attempt, answer);
      if (delay === undefined) throw answer;
      await this.pause(call, attempt, answer.message, delay);
    }
  }

  private answer<T>(call: Call<T>, response: Response, text: string): { value: T } | JobqError {
    if (!response.ok) return errorFromAnswer(response.status, response.statusText, response.headers, text);
    try {
      return { value: call.parse(JSON.parse(text), response.status, response.headers) };
    } catch (error) {
      // A 2xx that is not jobq's answer: a proxy's page, or a server that speaks another contract.
      return new JobqError(`${call.operation}: unexpected answer (${String(error)}): ${text.slice(0, 200)}`, {
        status: response.status,
      });
    }
  }

  private retryAfterAnswer(call: Call<unknown>, attempt: number, error: JobqError): number | undefined {
    if (attempt >= this.retry.attempts) return undefined;
    if (error instanceof RateLimited) return backoff(this.retry, attempt, error.retryAfter);
    const status = error.status ?? 0;
    if (call.safety === Safety.Repeatable && error instanceof ServerError && [502, 503, 504].includes(status)) {
      return backoff(this.retry, attempt, error.retryAfter);
    }
    return undefined;
  }

  private async pause(call: Call<unknown>, attempt: number, why: string, delay: number): Promise<void> {
    this.onRetry?.(call.operation, attempt, why, delay);
    await sleep(delay, call.signal);
  }
}

export interface FailOptions {
  /** Retry after this many seconds (default: the server's backoff). */
  retryInSeconds?: number | undefined;
  /** false: failed for good now, whatever attempts remain. */
  retry?: boolean;
}

export interface ClaimOptions {
  /** Most jobs to return (default 1). */
  limit?: number;
  /** The lease (default: the server's JOBQ_LEASE_DEFAULT_SECONDS). */
  leaseSeconds?: number | undefined;
  /** Long-poll: wait up to this long for a job (default 0: answer at once). */
  waitSeconds?: number;
  /** Abort the claim (a long-poll, say); the server hands back what it claimed for a request that went away. */
  signal?: AbortSignal | undefined;
}

/** JSON for a request body; refuses what the server would (NaN, Infinity, lone surrogates, BigInt...). */
export function encode(value: unknown): string {
  const text = JSON.stringify(value, (_key, v: unknown) => {
    if (typeof v === "number" && !Number.isFinite(v)) throw new TypeError(`${v} is not a JSON number`);
    if (typeof v === "string" && !v.isWellFormed()) throw new TypeError("a string holds a lone surrogate");
    if (v !== null && typeof v === "object" && !Array.isArray(v) && !Object.keys(v).every((k) => k.isWellFormed())) {
      throw new TypeError("a key holds a lone surrogate");
    }
    return v;
  });
  return text === undefined ? "null" : text;
}
