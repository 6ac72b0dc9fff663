// Error answers as typed errors, chosen by the problem+json `type` (RFC 9457), never by its text.
//
// JobqError                          every failure of a call: status, type, title, detail, problem
//  +-- TransportError                no answer at all (connection refused or reset, timeout), after retries
//  +-- WaitTimeout                   wait()/enqueueAndWait(): the job had not finished in time (`.job`)
//  +-- BadRequest              400   malformed-request
//  +-- Unauthorized            401   unauthorized           missing or unknown API key
//  +-- Forbidden               403   forbidden              the key may not do this
//  +-- NotFound                404   not-found              no such route (an older server?)
//  |    +-- JobNotFound        404   job-not-found
//  +-- Conflict                409   any other conflict
//  |    +-- ClaimLost          409   claim-lost             the token no longer holds the job
//  |    +-- InvalidState       409   invalid-state          the job's state does not allow the action
//  |    +-- JobCancelled       409   job-cancelled          an operator cancelled the running job
//  |    +-- JobTimedOut        409   job-timed-out          the job ran past its timeout_seconds and was failed
//  +-- PayloadTooLarge         413   payload-too-large
//  +-- UnsupportedMediaType    415   unsupported-media-type
//  +-- ValidationError         422   validation-error       `.errors` lists each problem
//  +-- RateLimited             429   too-many-waiters, rate-limited   `.retryAfter`
//  +-- ServerError             5xx   internal-error, and a proxy's 502/504
//       +-- ServiceUnavailable 503   database-unavailable, shutting-down, not-ready   `.retryAfter`
//
// A type this client does not know maps to the class of its status (a new 409 is still a Conflict), and
// to JobqError itself when the status has no class here. For a worker, every Conflict means "claim lost":
// stop working on the job and do not complete it. The same tree as the Python SDK's jobq_client.errors.

import type { components } from "./openapi.js";

export type Problem = components["schemas"]["Problem"];
export type ValidationIssue = components["schemas"]["ValidationIssue"];

export const PROBLEM_PREFIX = "urn:jobq:problem:";

export interface ErrorFields {
  status?: number | undefined;
  type?: string;
  title?: string;
  problem?: Record<string, unknown>;
  retryAfter?: number | undefined;
  cause?: unknown;
}

export class JobqError extends Error {
  /** The status this class stands for. */
  static readonly statusCode: number | undefined = undefined;
  /** The problem types it stands for, without the prefix. */
  static readonly slugs: readonly string[] = [];

  readonly status: number | undefined;
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  /** The problem+json document as the server sent it ({} when there was none). */
  readonly problem: Record<string, unknown>;
  /** Seconds to wait before trying again, from Retry-After. */
  readonly retryAfter: number | undefined;

  constructor(detail: string, fields: ErrorFields = {}) {
    super(detail, fields.cause === undefined ? undefined : { cause: fields.cause });
    const cls = new.target as typeof JobqError;
    this.name = cls.name;
    this.status = fields.status ?? cls.statusCode;
    this.type = fields.type ?? "about:blank";
    this.title = fields.title ?? "";
    this.detail = detail;
    this.problem = fields.problem ?? {};
    this.retryAfter = fields.retryAfter;
    const head = [this.status ? String(this.status) : "", this.slug || this.title].filter(Boolean).join(" ");
    this.message = head ? `${head}: ${detail}` : detail;
  }

  /** The problem type without `urn:jobq:problem:` (empty for a type from elsewhere). */
  get slug(): string {
    return this.type.startsWith(PROBLEM_PREFIX) ? this.type.slice(PROBLEM_PREFIX.length) : "";
  }
}

/** No answer from the server (connection refused or reset, timeout); the retries, if any, ran out. */
export class TransportError extends JobqError {}

/** The job had not finished when the wait's timeout passed; `.job` is the job as it was then. */
export class WaitTimeout extends JobqError {
  readonly job: components["schemas"]["Job"];

  constructor(job: components["schemas"]["Job"]) {
    super(`job ${job.id} is still ${job.status} after the wait's timeout`);
    this.job = job;
  }
}

export class BadRequest extends JobqError {
  static override readonly statusCode = 400;
  static override readonly slugs = ["malformed-request"];
}

export class Unauthorized extends JobqError {
  static override readonly statusCode = 401;
  static override readonly slugs = ["unauthorized"];
}

export class Forbidden extends JobqError {
  static override readonly statusCode = 403;
  static override readonly slugs = ["forbidden"];
}

export class NotFound extends JobqError {
  static override readonly statusCode = 404;
  static override readonly slugs: readonly string[] = ["not-found"];
}

export class JobNotFound extends NotFound {
  static override readonly slugs = ["job-not-found"];
}

/** The job is no longer held by this claim, or is in a state that refuses the call. */
export class Conflict extends JobqError {
  static override readonly statusCode = 409;
  static override readonly slugs: readonly string[] = ["conflict"];
}

export class ClaimLost extends Conflict {
  static override readonly slugs = ["claim-lost"];
}

export class InvalidState extends Conflict {
  static override readonly slugs = ["invalid-state"];
}

export class JobCancelled extends Conflict {
  static override readonly slugs = ["job-cancelled"];
}

/** The job ran longer than its `timeout_seconds` since this claim: the server failed it ("timeout"). */
export class JobTimedOut extends Conflict {
  static override readonly slugs = ["job-timed-out"];
}

export class PayloadTooLarge extends JobqError {
  static override readonly statusCode = 413;
  static override readonly slugs = ["payload-too-large"];
}

export class UnsupportedMediaType extends JobqError {
  static override readonly statusCode = 415;
  static override readonly slugs = ["unsupported-media-type"];
}

export class ValidationError extends JobqError {
  static override readonly statusCode = 422;
  static override readonly slugs = ["validation-error"];

  /** Each problem with its location (`loc`), message (`msg`) and kind (`type`). */
  get errors(): ValidationIssue[] {
    const found = this.problem["errors"];
    return Array.isArray(found) ? (found as ValidationIssue[]) : [];
  }
}

export class RateLimited extends JobqError {
  static override readonly statusCode = 429;
  static override readonly slugs = ["too-many-waiters", "rate-limited", "too-many-requests"];
}

export class ServerError extends JobqError {
  static override readonly statusCode: number = 500;
  static override readonly slugs: readonly string[] = ["internal-error"];
}

export class ServiceUnavailable extends ServerError {
  static override readonly statusCode = 503;
  static override readonly slugs = ["database-unavailable", "shutting-down", "not-ready"];
}

// Base classes before their subclasses, so that a status maps to its family's base class.
const CLASSES: (typeof JobqError)[] = [
  BadRequest,
  Unauthorized,
  Forbidden,
  NotFound,
  JobNotFound,
  Conflict,
  ClaimLost,
  InvalidState,
  JobCancelled,
  JobTimedOut,
  PayloadTooLarge,
  UnsupportedMediaType,
  ValidationError,
  RateLimited,
  ServerError,
  ServiceUnavailable,
];
const BY_SLUG = new Map<string, typeof JobqError>();
const BY_STATUS = new Map<number, typeof JobqError>();
for (const cls of CLASSES) {
  for (const slug of cls.slugs) BY_SLUG.set(slug, cls);
  if (cls.statusCode !== undefined && !BY_STATUS.has(cls.statusCode)) BY_STATUS.set(cls.statusCode, cls);
}

/** Seconds to wait from a Retry-After header: delta-seconds or an HTTP date. */
export function parseRetryAfter(value: string | null | undefined): number | undefined {
  if (!value) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  const when = Date.parse(text);
  return Number.isNaN(when) ? undefined : Math.max(0, (when - Date.now()) / 1000);
}

/** The error for an error answer: by problem type, else by status, else JobqError. */
export function errorFromAnswer(status: number, statusText: string, headers: Headers, body: string): JobqError {
  const retryAfter = parseRetryAfter(headers.get("retry-after"));
  let problem: Record<string, unknown> = {};
  try {
    const doc: unknown = JSON.parse(body);
    if (doc !== null && typeof doc === "object" && !Array.isArray(doc)) problem = doc as Record<string, unknown>;
  } catch {
    // not JSON: a proxy's page, say
  }
  const type = typeof problem["type"] === "string" && problem["type"] ? problem["type"] : "about:blank";
  const title = typeof problem["title"] === "string" && problem["title"] ? problem["title"] : statusText;
  let detail = problem["detail"];
  if (typeof detail !== "string" || !detail) {
    const text = Object.keys(problem).length === 0 ? body.trim().slice(0, 500) : "";
    detail = text || title || `HTTP ${status}`;
  }
  const slug = type.startsWith(PROBLEM_PREFIX) ? type.slice(PROBLEM_PREFIX.length) : "";
  let cls = slug ? BY_SLUG.get(slug) : undefined;
  if (cls === undefined || cls.statusCode !== status) {
    // unknown, or a type at an unexpected status
    cls = BY_STATUS.get(status) ?? (status >= 500 ? ServerError : JobqError);
  }
  return new cls(detail as string, { status, type, title, problem, retryAfter });
}
