// Enqueue inside your own database transaction (jobq's docs/producers.md, "Enqueue from SQL, in your own
// transaction"): the job commits if and only if your transaction does. These call the SQL functions jobq's
// migrations install (`jobq.enqueue`, `jobq.enqueue_batch`) through the node-postgres client you already use
// (a Client, or a PoolClient inside BEGIN ... COMMIT); no HTTP, no dependency of this package.
import { jobBody, type NewJob } from "./client.js";

/** What the functions need of a connection: node-postgres' `Client` or `PoolClient` (or anything alike). */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Array<Record<string, unknown>> }>;
}

/** The options of `enqueueInTransaction`: those of an HTTP enqueue, a group, and jobq's schema. */
export interface SqlEnqueueOptions extends Omit<NewJob, "payload" | "ref" | "dependsOn" | "unique"> {
  /** Ids of jobs this one waits for. */
  dependsOn?: number[];
  /** The job's group (the queue's group limits). */
  group?: string;
  /** A unique job; `true` keys on the payload's hash. */
  unique?: NewJob["unique"] | true;
  /** jobq's schema (JOBQ_DB_SCHEMA), `jobq` by default. */
  schema?: string;
}

// The parameters of jobq.enqueue (migrations/0045_sql_enqueue.sql) and their types.
const TYPES: Record<string, string> = {
  priority: "integer",
  run_at: "timestamptz",
  delay_seconds: "double precision",
  max_attempts: "integer",
  idempotency_key: "text",
  group_key: "text",
  depends_on: "bigint[]",
  on_dependency_failure: "text",
  timeout_seconds: "integer",
  unique_job: "boolean",
  unique_key: "text",
  unique_for_seconds: "integer",
  unique_while: "text[]",
  debounce_key: "text",
  debounce_seconds: "double precision",
  debounce_max_wait_seconds: "double precision",
};

function schemaName(name: string | undefined): string {
  const schema = name ?? "jobq";
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(schema)) {
    throw new TypeError(`${JSON.stringify(schema)} is not a schema name jobq accepts (lower-case letters, digits and _)`);
  }
  return schema;
}

/**
 * Make one job in `db`'s transaction; its id (the existing job's on an idempotency or unique hit, the replaced
 * one's on a debounce). A refusal rejects with the database's error (SQLSTATE 22023 for a bad argument, JQ429
 * for a full queue), which aborts the transaction as any failed statement does.
 */
export async function enqueueInTransaction(
  db: Queryable,
  queue: string,
  payload: unknown,
  options: SqlEnqueueOptions = {},
): Promise<number> {
  const args: Record<string, unknown> = {
    priority: options.priority,
    run_at: options.runAt instanceof Date ? options.runAt.toISOString() : options.runAt,
    delay_seconds: options.delaySeconds,
    max_attempts: options.maxAttempts,
    idempotency_key: options.idempotencyKey,
    group_key: options.group,
    depends_on: options.dependsOn,
    on_dependency_failure: options.onDependencyFailure,
    timeout_seconds: options.timeoutSeconds,
  };
  if (options.unique !== undefined) {
    const u = options.unique === true ? {} : options.unique;
    Object.assign(args, { unique_job: true, unique_key: u.key, unique_for_seconds: u.for_seconds, unique_while: u.while });
  }
  if (options.debounce !== undefined) {
    const d = options.debounce;
    Object.assign(args, { debounce_key: d.key, debounce_seconds: d.seconds, debounce_max_wait_seconds: d.max_wait_seconds });
  }
  const values: unknown[] = [queue, JSON.stringify(payload ?? null)];
  let named = "";
  for (const [name, value] of Object.entries(args)) {
    if (value === undefined || value === null) continue;
    values.push(value);
    named += `, ${name} => $${values.length}::${TYPES[name]}`;
  }
  const { rows } = await db.query(`SELECT ${schemaName(options.schema)}.enqueue($1::text, $2::jsonb${named}) AS id`, values);
  return Number(rows[0]?.id);
}

/**
 * Make a batch of jobs in `db`'s transaction, all or none; their ids in the batch's order (`ref` and
 * `dependsOn` by ref as in `enqueueBatch`).
 */
export async function enqueueBatchInTransaction(
  db: Queryable,
  queue: string,
  jobs: NewJob[],
  options: { schema?: string } = {},
): Promise<number[]> {
  const items = jobs.map(jobBody);
  const { rows } = await db.query(
    `SELECT ${schemaName(options.schema)}.enqueue_batch($1::text, $2::jsonb) AS ids`,
    [queue, JSON.stringify(items)],
  );
  return ((rows[0]?.ids as Array<string | number>) ?? []).map(Number);
}
