// The README's API tour through a TypeScript client made the way a user would make one: types generated
// by openapi-typescript from openapi/openapi.json (jobq.ts, beside this file when the test runs), calls
// made by openapi-fetch. Compiled with tsc --strict, then run against a live jobq:
//   node out/tour.js BASE_URL API_KEY
import createClient from "openapi-fetch";
import type { components, paths } from "./jobq.js";

type Job = components["schemas"]["Job"];
type Problem = components["schemas"]["Problem"];

const [base, key] = process.argv.slice(2);
if (!base || !key) throw new Error("usage: node tour.js BASE_URL API_KEY");
const jobq = createClient<paths>({ baseUrl: base, headers: { authorization: `Bearer ${key}` } });

function check(condition: boolean, what: string, seen?: unknown): asserts condition {
  if (!condition) throw new Error(`${what}: ${JSON.stringify(seen)}`);
}

function ok<T>(answer: { data?: T; error?: unknown; response: Response }, what: string): T {
  check(answer.data !== undefined, `${what} answered ${answer.response.status}`, answer.error);
  return answer.data;
}

const queue = { params: { path: { queue: "emails" } } };

// enqueue: 201 with the job; a repeated idempotency key returns the existing job with 200
const first = await jobq.POST("/queues/{queue}/jobs", {
  ...queue,
  body: { payload: { to: "ada@example.com" }, priority: 5, idempotency_key: "welcome-ada" },
});
const ada: Job = ok(first, "enqueue");
check(first.response.status === 201 && ada.status === "pending" && ada.result === null, "enqueued", ada);
const again = await jobq.POST("/queues/{queue}/jobs", {
  ...queue,
  body: { payload: { to: "ada@example.com" }, idempotency_key: "welcome-ada" },
});
check(again.response.status === 200 && ok(again, "repeat").id === ada.id, "idempotent repeat", again.data);

// later, or in a batch (all or nothing)
const later = ok(
  await jobq.POST("/queues/{queue}/jobs", { ...queue, body: { payload: { to: "bob@example.com" }, delay_seconds: 60 } }),
  "delayed enqueue",
);
check(Date.parse(later.run_at) > Date.parse(later.created_at), "delayed", later);
const batch = ok(
  await jobq.POST("/queues/{queue}/jobs/batch", { ...queue, body: { jobs: [{ payload: 1 }, { payload: 2 }, { payload: 3 }] } }),
  "batch enqueue",
);
check(batch.jobs.length === 3, "batch", batch);

// a worker claims up to 10 jobs with a 5-minute lease (the delayed job is not due)
const claimed = ok(
  await jobq.POST("/queues/{queue}/claim", { ...queue, body: { worker: "mailer-1", limit: 10, lease_seconds: 300 } }),
  "claim",
).jobs;
check(claimed.length === 4 && claimed[0]?.id === ada.id, "claim order", claimed);
const [a, b, c, d] = claimed as [typeof claimed[number], typeof claimed[number], typeof claimed[number], typeof claimed[number]];
check(a.attempts === 1 && typeof a.claim_token === "string", "claim", a);

// still working: extend the lease
const beat = ok(
  await jobq.POST("/jobs/{job_id}/heartbeat", { params: { path: { job_id: a.id } }, body: { claim_token: a.claim_token } }),
  "heartbeat",
);
check(beat.id === a.id && beat.cancel_requested === false && beat.lease_expires_at !== null, "heartbeat", beat);

// done; the same complete again is a success that keeps the first result
const done = { params: { path: { job_id: a.id } }, body: { claim_token: a.claim_token, result: { message_id: "abc" } } };
const completed = ok(await jobq.POST("/jobs/{job_id}/complete", done), "complete");
check(completed.status === "completed", "completed", completed);
const repeated = ok(await jobq.POST("/jobs/{job_id}/complete", { ...done, body: { ...done.body, result: "other" } }), "repeat");
check(JSON.stringify(repeated.result) === JSON.stringify({ message_id: "abc" }), "first result kept", repeated);

// or failed: retried later
const failed = ok(
  await jobq.POST("/jobs/{job_id}/fail", {
    params: { path: { job_id: b.id } },
    body: { claim_token: b.claim_token, error: "SMTP 451", retry_in_seconds: 30 },
  }),
  "fail",
);
check(failed.status === "pending" && failed.last_error === "SMTP 451", "failed", failed);

// or handed back untried: pending again, the attempt not counted
const released = ok(
  await jobq.POST("/jobs/{job_id}/release", { params: { path: { job_id: d.id } }, body: { claim_token: d.claim_token } }),
  "release",
);
check(released.status === "pending" && released.attempts === 0, "released", released);

// many at once, each with its own outcome
const outcomes = ok(
  await jobq.POST("/jobs/complete", {
    body: { jobs: [{ id: c.id, claim_token: c.claim_token, result: "sent" }, { id: b.id, claim_token: b.claim_token }] },
  }),
  "batch complete",
).results;
check(outcomes[0]?.outcome === "completed" && outcomes[1]?.outcome === "claim_lost", "outcomes", outcomes);

// a stale token: a typed problem
const stale = await jobq.POST("/jobs/{job_id}/heartbeat", { params: { path: { job_id: b.id } }, body: { claim_token: b.claim_token } });
const conflict: Problem | undefined = stale.error;
check(stale.response.status === 409 && conflict?.type === "urn:jobq:problem:claim-lost", "409", conflict);
const refused = await jobq.POST("/queues/{queue}/claim", { ...queue, body: { worker: "mailer-1", limit: 0 } });
const issue = refused.error?.errors?.[0];
check(refused.response.status === 422 && issue?.loc.join(".") === "body.limit" && typeof issue.msg === "string", "422", refused.error);

// inspect a job (never shows the claim token)
const got = ok(await jobq.GET("/jobs/{job_id}", { params: { path: { job_id: a.id } } }), "get job");
check(got.status === "completed" && !("claim_token" in got), "get job", got);
const page = ok(
  await jobq.GET("/queues/{queue}/jobs", { params: { path: { queue: "emails" }, query: { status: "pending", limit: 10 } } }),
  "list jobs",
);
check(page.jobs.length === 3 && page.next_cursor === null, "listing", page);
console.log("tour ok");
