// Worker: long-polls the queues it has handlers for, runs each job's handler, heartbeats while it runs,
// then completes or fails the job. Stops cleanly: no new claims, jobs in flight finish within a grace
// period or are released (handed back without spending an attempt). The semantics of the Python SDK's
// Worker (jobq_client/worker.py), in Node.js terms: a handler is told to stop through an AbortSignal.

import { hostname } from "node:os";

import { Client, encode, sleep } from "./client.js";
import type { Claim, ClientOptions, CompleteOutcome, Completion, RetryPolicy } from "./client.js";
import {
  BadRequest,
  Conflict,
  JobNotFound,
  JobqError,
  JobTimedOut,
  NotFound,
  PayloadTooLarge,
  RateLimited,
  ServerError,
  TransportError,
  ValidationError,
} from "./errors.js";
import type { ValidationIssue } from "./errors.js";

/** Why a handler was told to stop (its signal's reason is an Error with this message). */
export const CLAIM_LOST = "claim lost";
export const CANCEL_REQUESTED = "cancel requested";
/** The job ran past its `timeout_seconds`: the server failed it, and retries it or not as any failure. */
export const TIMED_OUT = "timed out";
export const SHUTDOWN = "worker shutting down";

const MAX_ERROR_CHARS = 4000; // the server keeps JOBQ_MAX_ERROR_BYTES (2 KiB by default) of it anyway
const MAX_CLAIM = 100; // jobs asked for in one claim: the server's default JOBQ_MAX_CLAIM_LIMIT
const MAX_HAND_IN = 1000; // completions carried by one claim: the server's default JOBQ_MAX_BATCH_COMPLETE
const ABANDON_WAIT_SECONDS = 5; // how long a handler told to stop is waited for before its slot is freed

/**
 * Throw from a handler to fail this attempt and have the job retried after `retryIn` seconds (undefined:
 * after the server's backoff). Once the attempts are used up the job is failed all the same.
 */
export class RetryLater extends Error {
  readonly retryIn: number | undefined;

  constructor(message = "retry requested", options: { retryIn?: number } = {}) {
    super(message);
    this.name = "RetryLater";
    this.retryIn = options.retryIn;
  }
}

/** Throw from a handler to fail the job for good now, whatever attempts remain. */
export class PermanentFailure extends Error {
  constructor(message?: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PermanentFailure";
  }
}

/**
 * What a handler receives: the claimed job, and whether it should stop.
 *
 * `signal` aborts (and `stopped` turns true) when the claim is lost (lease lapsed, job reclaimed), when an
 * operator cancels the job, when the job ran past its `timeout_seconds` (the server failed it: TIMED_OUT),
 * or when the worker stops before the handler finished. Pass the signal to what
 * the handler awaits (fetch, timers). Whatever a stopped handler returns is not sent.
 */
export class JobContext {
  readonly claim: Claim;
  private readonly controller = new AbortController();
  private reason: string | undefined;
  private reported: { value: unknown } | undefined; // progress not sent yet
  private reportedNow = new AbortController(); // aborts when progress is reported

  constructor(claim: Claim) {
    this.claim = claim;
  }

  get id(): number {
    return this.claim.id;
  }
  get queue(): string {
    return this.claim.queue;
  }
  get payload(): unknown {
    return this.claim.payload;
  }
  get attempts(): number {
    return this.claim.attempts;
  }
  get maxAttempts(): number {
    return this.claim.max_attempts;
  }
  /** A failure now fails the job for good. */
  get lastAttempt(): boolean {
    return this.claim.attempts >= this.claim.max_attempts;
  }
  get signal(): AbortSignal {
    return this.controller.signal;
  }
  get stopped(): boolean {
    return this.controller.signal.aborted;
  }
  /** CLAIM_LOST, CANCEL_REQUESTED, TIMED_OUT or SHUTDOWN once stopped. */
  get stopReason(): string | undefined {
    return this.reason;
  }

  /** Sleep, but wake at once when told to stop. True when stopped. */
  async sleep(seconds: number): Promise<boolean> {
    try {
      await sleep(seconds, this.signal);
    } catch {
      // stopped
    }
    return this.stopped;
  }

  /**
   * Report progress (any JSON value, e.g. `{ done: 40, total: 100 }`; null clears it): shown on the job
   * (GET /jobs/{id}, the dashboard) until its next claim. It never blocks: it is sent with the next heartbeat,
   * which comes early for it but at most once a second, so only the latest value is sent.
   */
  progress(value: unknown): void {
    this.reported = { value };
    this.reportedNow.abort();
  }

  /** @internal The progress to send, if any; what follows waits for the next report. */
  takeProgress(): { value: unknown } | undefined {
    const reported = this.reported;
    this.reported = undefined;
    if (this.reportedNow.signal.aborted) this.reportedNow = new AbortController();
    return reported;
  }

  /** @internal Aborts when progress is reported (or was, and is not sent yet). */
  get progressSignal(): AbortSignal {
    return this.reportedNow.signal;
  }

  /** @internal */
  stop(reason: string): void {
    if (this.reason === undefined) {
      this.reason = reason;
      this.controller.abort(new Error(reason));
    }
  }
}

export type Handler = (job: JobContext) => unknown;

/** The most often a job's reported progress is sent (seconds). */
const PROGRESS_INTERVAL_SECONDS = 1;

/** A signal that aborts when either does; it lets go of both when it aborts. */
function either(a: AbortSignal, b: AbortSignal): AbortSignal {
  const both = new AbortController();
  const abort = (): void => {
    a.removeEventListener("abort", abort);
    b.removeEventListener("abort", abort);
    both.abort();
  };
  if (a.aborted || b.aborted) both.abort();
  else {
    a.addEventListener("abort", abort, { once: true });
    b.addEventListener("abort", abort, { once: true });
  }
  return both.signal;
}

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string, error?: unknown): void;
}

const DEFAULT_LOGGER: Logger = {
  info: () => {},
  warn: (message) => console.warn(`jobq: ${message}`),
  error: (message, error) => (error === undefined ? console.error(`jobq: ${message}`) : console.error(`jobq: ${message}`, error)),
};

export interface WorkerOptions {
  /** Sent as `Authorization: Bearer <key>` (when the worker makes its own Client). */
  apiKey?: string | undefined;
  /** Stored on each claimed job (default host-pid). */
  name?: string;
  /** Jobs of each queue that run at once (default 10). */
  concurrency?: number;
  /** The lease each claim asks for (default 30 s); heartbeats renew it. */
  leaseSeconds?: number;
  /** Long-poll wait of a claim (default 20 s). */
  waitSeconds?: number;
  /** Between heartbeats (default a third of the lease, so that two may fail before it lapses). */
  heartbeatIntervalSeconds?: number;
  /** On stop: how long jobs in flight may take before they are released (default 30 s). */
  shutdownGraceSeconds?: number;
  /** The client's retry policy (when the worker makes its own Client). */
  retry?: Partial<RetryPolicy>;
  /** info, warn and error lines (default: warnings and errors on the console). */
  logger?: Partial<Logger>;
  /** Called when a claim came back empty while no job of this worker was running (a batch run may stop then). */
  onIdle?: () => void;
}

interface HandIn {
  completion: Completion;
  settle: (outcome: CompleteOutcome | undefined) => void;
}

interface QueueState {
  name: string;
  handler: Handler;
  concurrency: number;
  running: Set<Claim>; // jobs holding a slot
  tasks: Set<Promise<void>>; // every job until its outcome is recorded
  freed: Wake;
  waitingForSlot: boolean; // the claim loop is idle for want of a slot: it claims the moment one frees
  handIn: HandIn[]; // results to complete with that claim
}

class Wake {
  private waiters: (() => void)[] = [];
  wait(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve));
  }
  notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

function errorText(error: unknown): string {
  const text = (error instanceof Error ? (error.message ? `${error.name}: ${error.message}` : error.name) : String(error)).toWellFormed();
  return text.length <= MAX_ERROR_CHARS ? text : `${text.slice(0, MAX_ERROR_CHARS - 12)} [truncated]`;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function signalled(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

function settledWithin(work: Promise<unknown>, seconds: number): Promise<unknown> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise((resolve) => (timer = setTimeout(resolve, seconds * 1000)));
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}

const aboutLimit = (e: ValidationIssue): boolean => e.loc[e.loc.length - 1] === "limit";
const aboutHandIn = (e: ValidationIssue): boolean => e.loc[0] === "body" && e.loc[1] === "complete";
const aboutHandInField = (e: ValidationIssue): boolean => aboutHandIn(e) && e.loc.length === 2;

/** The claim limit to try after `sent` was refused: the server's maximum when it says so, else half. */
function lowerLimit(errors: ValidationIssue[], sent: number): number {
  for (const e of errors) {
    const ctx = (e as { ctx?: { le?: unknown } }).ctx;
    const le = ctx?.le;
    if (typeof le === "number" && Number.isInteger(le) && le >= 1 && le < sent) return le;
  }
  return Math.max(1, Math.floor(sent / 2));
}

/**
 * Runs handlers for jobs of one or more queues.
 *
 *     const worker = new Worker("http://127.0.0.1:8000", { concurrency: 10 });
 *     worker.register("emails", async (job) => ({ messageId: await send(job.payload, job.signal) }));
 *     await worker.run(); // until SIGTERM or SIGINT, or worker.stop()
 *
 * A handler's return value (JSON) completes the job; a thrown error fails the attempt with the error's
 * name and message, and the server retries the job later while attempts remain (`RetryLater` chooses
 * when, `PermanentFailure` stops the retries).
 *
 * `concurrency` is per queue. Heartbeats renew the lease every `heartbeatIntervalSeconds` (a third of
 * the lease) while the handler runs. A heartbeat that answers 409 or 404, or that says
 * `cancel_requested`, means the job is no longer ours: the handler's signal aborts and the job is neither
 * completed nor failed. A finished job's result rides on the next claim when the worker is about to claim
 * at once (a slot is free and no claim is in flight): one request per job. Otherwise, and against a server
 * without that contract, it is completed by itself.
 *
 * On stop (SIGTERM/SIGINT when `run()` handles signals, or `stop()`) the worker claims nothing more and
 * waits up to `shutdownGraceSeconds` for jobs in flight; jobs still running then (or at a second stop)
 * are released: pending again at once for another worker, their attempt not counted (a server without
 * the release call gets a fail with an immediate retry instead, which does count the attempt).
 */
export class Worker {
  readonly name: string;
  readonly concurrency: number;
  readonly leaseSeconds: number;
  readonly waitSeconds: number;
  readonly heartbeatIntervalSeconds: number;
  readonly shutdownGraceSeconds: number;
  private readonly client: Client | undefined;
  private readonly url: string;
  private readonly clientOptions: ClientOptions;
  private readonly log: Logger;
  private readonly onIdle: (() => void) | undefined;
  private readonly queues = new Map<string, QueueState>();
  private readonly active = new Set<JobContext>();
  private stopping: AbortController | undefined;
  private stopped: Promise<void> = Promise.resolve(); // settles when `stopping` aborts (one listener per run)
  private forced: AbortController | undefined;
  private earlyStops = 0;
  private fatal: unknown;
  private handInSupported = true;

  constructor(client: Client | string = "http://127.0.0.1:8000", options: WorkerOptions = {}) {
    const concurrency = options.concurrency ?? 10;
    const lease = options.leaseSeconds ?? 30;
    const interval = options.heartbeatIntervalSeconds ?? lease / 3;
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new RangeError("concurrency must be an integer, at least 1");
    if (!Number.isInteger(lease) || lease < 1) throw new RangeError("leaseSeconds must be an integer, at least 1");
    if (!(interval > 0 && interval < lease)) throw new RangeError("heartbeatIntervalSeconds must be positive and shorter than the lease");
    const wait = options.waitSeconds ?? 20;
    const grace = options.shutdownGraceSeconds ?? 30;
    if (!(wait >= 0) || !(grace >= 0)) throw new RangeError("waitSeconds and shutdownGraceSeconds cannot be negative");
    this.client = client instanceof Client ? client : undefined;
    this.url = typeof client === "string" ? client : client.baseUrl;
    this.clientOptions = { apiKey: options.apiKey, retry: options.retry };
    this.name = options.name ?? `${hostname()}-${process.pid}`;
    this.concurrency = concurrency;
    this.leaseSeconds = lease;
    this.waitSeconds = wait;
    this.heartbeatIntervalSeconds = interval;
    this.shutdownGraceSeconds = grace;
    this.log = { ...DEFAULT_LOGGER, ...options.logger };
    this.onIdle = options.onIdle;
  }

  // -- registration ---------------------------------------------------------------------------------------

  /** Run `handler` for the jobs of `queue`, at most `concurrency` at once (default: the worker's). */
  register(queue: string, handler: Handler, options: { concurrency?: number } = {}): this {
    if (this.queues.has(queue)) throw new Error(`queue ${queue} already has a handler`);
    const limit = options.concurrency ?? this.concurrency;
    if (!Number.isInteger(limit) || limit < 1) throw new RangeError("concurrency must be an integer, at least 1");
    this.queues.set(queue, {
      name: queue,
      handler,
      concurrency: limit,
      running: new Set(),
      tasks: new Set(),
      freed: new Wake(),
      waitingForSlot: false,
      handIn: [],
    });
    return this;
  }

  /** Jobs whose handlers are running now. */
  get inFlight(): number {
    let n = 0;
    for (const q of this.queues.values()) n += q.running.size;
    return n;
  }

  // -- running and stopping ----------------------------------------------------------------------------------

  /**
   * Stop claiming and let jobs in flight finish (`now`: hand them back at once). A second call acts like
   * `now`. Called before run(), run() returns at once.
   */
  stop(options: { now?: boolean } = {}): void {
    if (this.stopping === undefined) {
      this.earlyStops += options.now ? 2 : 1;
      return;
    }
    this.requestStop(options.now ?? false);
  }

  private requestStop(now = false): void {
    const stopping = this.stopping;
    const forced = this.forced;
    if (stopping === undefined || forced === undefined) return;
    if (now || stopping.signal.aborted) {
      stopping.abort(); // no new claims, also when the first request is already `now`
      if (!forced.signal.aborted) {
        this.log.warn(`stopping now: handing back ${this.active.size} job(s) still running`);
        forced.abort();
        for (const ctx of this.active) ctx.stop(SHUTDOWN);
      }
      return;
    }
    this.log.info(`stopping: no new claims; finishing ${this.inFlight} job(s) in flight`);
    stopping.abort();
  }

  /**
   * Run until stopped. With `handleSignals` (default true) SIGTERM and SIGINT stop it (twice: at once).
   * Rejects with the error that stopped it, if any (an answer that retrying cannot fix, such as 401 or
   * 403 on claim).
   */
  async run(options: { handleSignals?: boolean } = {}): Promise<void> {
    if (this.queues.size === 0) throw new Error("register a handler for at least one queue first");
    if (this.stopping !== undefined) throw new Error("this worker is running already");
    const stopping = (this.stopping = new AbortController());
    this.stopped = signalled(stopping.signal);
    this.forced = new AbortController();
    this.fatal = undefined;
    const early = this.earlyStops;
    this.earlyStops = 0;
    for (let i = 0; i < early; i++) this.requestStop();
    const client = this.client ?? new Client(this.url, this.clientOptions);
    const signals: [NodeJS.Signals, () => void][] = [];
    if (options.handleSignals ?? true) {
      for (const name of ["SIGTERM", "SIGINT"] as const) {
        const listener = (): void => {
          this.log.info(`received ${name}`);
          this.requestStop();
        };
        process.on(name, listener);
        signals.push([name, listener]);
      }
    }
    try {
      const pollers = [...this.queues.values()].map((q) => this.guardedPoll(client, q));
      await this.stopped;
      await Promise.all(pollers);
      await this.drain();
    } finally {
      for (const [name, listener] of signals) process.off(name, listener);
      this.stopping = undefined;
      this.forced = undefined;
    }
    if (this.fatal !== undefined) throw this.fatal;
  }

  private async drain(): Promise<void> {
    const tasks = [...this.queues.values()].flatMap((q) => [...q.tasks]);
    if (tasks.length === 0) return;
    const everything = Promise.all(tasks);
    const forced = this.forced?.signal;
    let timer: NodeJS.Timeout | undefined;
    const grace = new Promise<void>((resolve) => (timer = setTimeout(resolve, this.shutdownGraceSeconds * 1000)));
    const waits = [everything.then(() => true), grace.then(() => false)];
    if (forced !== undefined) waits.push(signalled(forced).then(() => false));
    const finished = await Promise.race(waits);
    clearTimeout(timer);
    if (!finished) {
      this.requestStop(true);
      await everything;
    }
    // Jobs that were handed in to a claim that never went out (the loop stopped): complete them now.
    await Promise.all([...this.queues.values()].flatMap((q) => [...q.tasks]));
  }

  /** Sleep, but return early when the worker stops. */
  private async pause(seconds: number): Promise<void> {
    try {
      await sleep(seconds, this.stopping?.signal);
    } catch {
      // stopping
    }
  }

  // -- claiming ---------------------------------------------------------------------------------------------

  private async guardedPoll(client: Client, q: QueueState): Promise<void> {
    try {
      await this.poll(client, q);
    } catch (error) {
      // A bug here must stop the worker, not leave it claiming nothing.
      this.log.error(`claim loop of ${q.name} crashed; stopping the worker`, error);
      this.fatal ??= error;
      this.requestStop();
    } finally {
      this.settleHandIn(q.handIn.splice(0)); // nothing more will carry them: their jobs complete by themselves
    }
  }

  private async poll(client: Client, q: QueueState): Promise<void> {
    const stopping = this.stopping as AbortController;
    let failures = 0;
    let cap = MAX_CLAIM; // lowered when the server's JOBQ_MAX_CLAIM_LIMIT is lower
    while (!stopping.signal.aborted) {
      const free = q.concurrency - q.running.size;
      if (free <= 0) {
        q.waitingForSlot = true;
        await Promise.race([q.freed.wait(), this.stopped]);
        q.waitingForSlot = false;
        continue;
      }
      const handIn = q.handIn.splice(0, MAX_HAND_IN);
      const limit = Math.min(free, cap);
      let answer;
      try {
        answer = await client.claimAndComplete(
          q.name,
          this.name,
          handIn.map((h) => h.completion),
          { limit, leaseSeconds: this.leaseSeconds, waitSeconds: this.waitSeconds, signal: stopping.signal },
        );
      } catch (error) {
        // Whether the server completed them is unknown: each is completed by itself (a repeat with the same
        // token is a success), whatever went wrong.
        this.settleHandIn(handIn);
        if (stopping.signal.aborted) return; // the long-poll was abandoned; the server hands back what it claimed
        if (error instanceof ValidationError && handIn.length > 0 && error.errors.some(aboutHandIn)) {
          if (error.errors.some(aboutHandInField)) {
            // A server without the one-request-per-job contract (or with a lower JOBQ_MAX_BATCH_COMPLETE).
            this.handInSupported = false;
            this.log.info(`claim on ${q.name}: the server takes no completions on a claim (${describe(error)}); completing jobs by themselves`);
          }
          continue;
        }
        if (error instanceof TransportError || error instanceof RateLimited || error instanceof ServerError) {
          failures += 1;
          const delay = Math.min(30, 0.5 * 2 ** Math.min(failures, 6)) * (0.5 + Math.random() / 2);
          this.log.warn(`claim on ${q.name} failed (${describe(error)}); trying again in ${delay.toFixed(1)}s`);
          await this.pause(delay);
          continue;
        }
        if (error instanceof ValidationError && limit > 1 && error.errors.length > 0 && error.errors.every(aboutLimit)) {
          cap = lowerLimit(error.errors, limit);
          this.log.warn(`claim on ${q.name}: the server takes at most ${cap} jobs a claim (${describe(error)})`);
          continue;
        }
        // 400/401/403/404/422: retrying will not help (bad key, bad queue name, older server).
        this.log.error(`claim on ${q.name} refused, stopping the worker: ${describe(error)}`);
        this.fatal ??= error;
        this.requestStop();
        return;
      }
      failures = 0;
      handIn.forEach((h, i) => h.settle(answer.completed[i]));
      for (const claim of answer.jobs) this.start(client, q, claim);
      if (answer.jobs.length === 0 && this.inFlight === 0) this.onIdle?.();
    }
  }

  private settleHandIn(handIn: HandIn[]): void {
    for (const h of handIn) h.settle(undefined);
  }

  private start(client: Client, q: QueueState, claim: Claim): void {
    q.running.add(claim);
    const task: Promise<void> = this.process(client, q, claim)
      .catch((error: unknown) => this.log.error(`job ${claim.id}: task crashed`, error))
      .finally(() => {
        q.tasks.delete(task);
        this.freeSlot(q, claim);
      });
    q.tasks.add(task);
  }

  private freeSlot(q: QueueState, claim: Claim): void {
    if (q.running.delete(claim)) q.freed.notify();
  }

  // -- one job ----------------------------------------------------------------------------------------------

  private async process(client: Client, q: QueueState, claim: Claim): Promise<void> {
    const ctx = new JobContext(claim);
    if (this.forced?.signal.aborted) {
      // claimed as the worker was told to stop now: hand it straight back
      await this.handBack(client, ctx, "before the handler started");
      return;
    }
    this.active.add(ctx);
    const finished = new AbortController();
    void this.heartbeats(client, ctx, finished.signal);
    let outcome: Outcome | undefined;
    try {
      const work: Promise<Outcome> = Promise.resolve()
        .then(() => q.handler(ctx))
        .then(
          (value): Outcome => ({ ok: true, value }),
          (error: unknown): Outcome => ({ ok: false, error }),
        );
      outcome = await Promise.race([work, signalled(ctx.signal).then(() => undefined)]);
      // A handler that gave up because it was told to stop (it threw on its aborted signal) did not fail.
      if (outcome === undefined || (ctx.stopped && !outcome.ok)) {
        // Told to stop before the handler finished.
        this.log.warn(`job ${claim.id}: ${ctx.stopReason}; stopping its handler`);
        await settledWithin(work, ABANDON_WAIT_SECONDS); // a handler that ignores its signal is left behind
        if (ctx.stopReason === SHUTDOWN) await this.handBack(client, ctx, "before the handler finished");
        return;
      }
    } finally {
      finished.abort();
      this.active.delete(ctx);
    }
    if (ctx.stopReason === CLAIM_LOST || ctx.stopReason === CANCEL_REQUESTED || ctx.stopReason === TIMED_OUT) {
      this.log.info(`job ${claim.id}: ${ctx.stopReason} while its handler finished; not completing it`);
      return;
    }
    await this.report(client, q, ctx, outcome);
  }

  /** Release a job this worker will not finish: the attempt was not a real one, so it is given back. */
  private async handBack(client: Client, ctx: JobContext, when: string): Promise<void> {
    this.log.info(`job ${ctx.id}: ${SHUTDOWN}, released ${when}`);
    try {
      await client.release(ctx.id, ctx.claim.claim_token);
    } catch (error) {
      if (error instanceof NotFound && !(error instanceof JobNotFound)) {
        // No such route: a server older than the release call. Fail with an immediate retry instead.
        await this.send(ctx, () => client.fail(ctx.id, ctx.claim.claim_token, `${SHUTDOWN}: handed back ${when}`, { retryInSeconds: 0, minimal: true }));
      } else {
        this.unrecorded(ctx, error);
      }
    }
  }

  private async report(client: Client, q: QueueState, ctx: JobContext, outcome: Outcome): Promise<void> {
    let error: unknown;
    if (outcome.ok) {
      const result = outcome.value === undefined ? null : outcome.value;
      try {
        encode(result); // as the client will: strict JSON
      } catch (bad) {
        error = new TypeError(`the handler's result is not JSON: ${describe(bad)}`);
      }
      if (error === undefined) {
        const refused = await this.complete(client, q, ctx, result);
        if (refused === undefined) return;
        // Another try with the same result gets the same answer: fail the attempt rather than leave the job
        // running until its lease lapses.
        error = new Error(`the server refused the handler's result: ${describe(refused)}`);
      }
    } else {
      error = outcome.error;
    }
    const token = ctx.claim.claim_token;
    if (error instanceof RetryLater) {
      this.log.info(`job ${ctx.id}: retry requested (${error.message})`);
      await this.retryLater(client, ctx, error);
    } else if (error instanceof PermanentFailure) {
      this.log.warn(`job ${ctx.id}: failed for good: ${error.message}`);
      await this.send(ctx, () => client.fail(ctx.id, token, errorText(error), { retry: false, minimal: true }));
    } else {
      this.log.warn(`job ${ctx.id}: attempt ${ctx.attempts} failed: ${errorText(error)}`);
      await this.send(ctx, () => client.fail(ctx.id, token, errorText(error), { minimal: true }));
    }
  }

  /**
   * Complete the job: on the next claim when the claim loop is about to claim at once, else by itself.
   * Returns the server's refusal of the result (400/413/422), if it refused it.
   */
  private async complete(client: Client, q: QueueState, ctx: JobContext, result: unknown): Promise<JobqError | undefined> {
    const completion: Completion = { id: ctx.id, claimToken: ctx.claim.claim_token, result };
    if (this.handInSupported && q.waitingForSlot && !this.stopping?.signal.aborted && q.handIn.length < MAX_HAND_IN) {
      const outcome = await new Promise<CompleteOutcome | undefined>((settle) => {
        q.handIn.push({ completion, settle });
        this.freeSlot(q, ctx.claim); // the claim loop wakes and claims with it
      });
      if (outcome !== undefined) {
        if (outcome.outcome === "not_found") this.log.warn(`job ${ctx.id}: gone before the outcome was recorded`);
        else if (outcome.outcome !== "completed") {
          this.log.warn(`job ${ctx.id}: claim lost before the outcome was recorded (${outcome.outcome}, ${outcome.status})`);
        }
        return undefined;
      }
      // The claim did not say (it failed, or never went out): complete it by itself.
    }
    try {
      await client.complete(ctx.id, completion.claimToken, result, { minimal: true });
    } catch (error) {
      if (error instanceof BadRequest || error instanceof PayloadTooLarge || error instanceof ValidationError) return error;
      this.unrecorded(ctx, error);
    }
    return undefined;
  }

  /**
   * Fail the attempt with the handler's delay; a delay the server cannot take (negative, not a number,
   * past its maximum) falls back to its backoff rather than leave the job running until its lease.
   */
  private async retryLater(client: Client, ctx: JobContext, error: RetryLater): Promise<void> {
    const token = ctx.claim.claim_token;
    const text = errorText(error);
    let retryIn = error.retryIn;
    if (retryIn !== undefined && !(typeof retryIn === "number" && Number.isFinite(retryIn))) {
      this.log.warn(`job ${ctx.id}: retryIn=${String(retryIn)} is not a number of seconds; using the backoff`);
      retryIn = undefined;
    }
    try {
      await client.fail(ctx.id, token, text, { retryInSeconds: retryIn, minimal: true });
    } catch (refused) {
      if ((refused instanceof BadRequest || refused instanceof ValidationError) && retryIn !== undefined) {
        this.log.warn(`job ${ctx.id}: retryIn=${retryIn} refused (${describe(refused)}); using the backoff`);
        await this.send(ctx, () => client.fail(ctx.id, token, text, { minimal: true }));
      } else {
        this.unrecorded(ctx, refused);
      }
    }
  }

  private async send(ctx: JobContext, call: () => Promise<unknown>): Promise<void> {
    try {
      await call();
    } catch (error) {
      this.unrecorded(ctx, error);
    }
  }

  private async heartbeats(client: Client, ctx: JobContext, finished: AbortSignal): Promise<void> {
    let last = Date.now();
    for (;;) {
      // Every heartbeat interval, or earlier when the handler reported progress (at most once a second).
      try {
        await sleep(this.heartbeatIntervalSeconds, either(finished, ctx.progressSignal));
      } catch {
        if (finished.aborted) return; // the handler finished
        const gap = Math.min(PROGRESS_INTERVAL_SECONDS, this.heartbeatIntervalSeconds) - (Date.now() - last) / 1000;
        try {
          if (gap > 0) await sleep(gap, finished);
        } catch {
          return;
        }
      }
      const progress = ctx.takeProgress();
      last = Date.now();
      let beat;
      try {
        beat = await client.heartbeat(ctx.id, ctx.claim.claim_token, progress === undefined ? {} : { progress: progress.value });
      } catch (error) {
        if (error instanceof Conflict || error instanceof NotFound) {
          ctx.stop(error instanceof JobTimedOut ? TIMED_OUT : CLAIM_LOST);
          this.log.warn(`job ${ctx.id}: heartbeat refused (${describe(error)})`);
          return;
        }
        // The lease may still hold; the next beat tells. If it lapsed, that beat gets 409.
        if (!finished.aborted) this.log.warn(`job ${ctx.id}: heartbeat failed (${describe(error)}); trying again`);
        continue;
      }
      if (beat.cancel_requested) {
        ctx.stop(CANCEL_REQUESTED);
        return;
      }
    }
  }

  /** Log why a job's outcome (complete, fail, release) was not recorded. */
  private unrecorded(ctx: JobContext, why: unknown): void {
    if (why instanceof Conflict) {
      this.log.warn(`job ${ctx.id}: claim lost before the outcome was recorded (${describe(why)})`);
    } else if (why instanceof NotFound) {
      this.log.warn(`job ${ctx.id}: gone before the outcome was recorded (${describe(why)})`);
    } else {
      this.log.error(`job ${ctx.id}: could not record the outcome (${describe(why)}); it will run again after its lease`);
    }
  }
}
