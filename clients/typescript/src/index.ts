// @jobq/client: a typed client and a Worker for jobq, the HTTP job queue on PostgreSQL.
export * from "./client.js";
export * from "./errors.js";
export * from "./worker.js";
export type { components, operations, paths } from "./openapi.js";
export * from "./sql.js";
