/**
 * What a refused call says beyond its status code and message: the reason (`MEMORY_NOT_FOUND`,
 * `SKILL_NAME_TAKEN`, ...), its metadata, and the request fields at fault. The server sends
 * them as google.rpc.ErrorInfo and google.rpc.BadRequest inside a google.rpc.Status in the
 * `grpc-status-details-bin` trailer, as the Python client reads them (MnemoError).
 */
import type { ServiceError } from "@grpc/grpc-js";
import { BadRequest, ErrorInfo } from "./gen/google/rpc/error_details";
import { Status } from "./gen/google/rpc/status";

export interface ErrorDetails {
  /** ErrorInfo.reason; "" when the server gave none. */
  reason: string;
  /** ErrorInfo.metadata (ids involved, e.g. `holder_id`). */
  metadata: Record<string, string>;
  /** BadRequest field violations: the request fields at fault, as the server names them. */
  fields: { field: string; description: string }[];
}

const TRAILER = "grpc-status-details-bin";

/** The details of a failed call's error; empty when it carries none (e.g. a client-side deadline). */
export function errorDetails(err: ServiceError): ErrorDetails {
  const out: ErrorDetails = { reason: "", metadata: {}, fields: [] };
  const raw = err.metadata?.get(TRAILER)[0];
  if (raw === undefined || typeof raw === "string") return out;
  for (const detail of Status.decode(raw).details) {
    const type = detail.typeUrl.slice(detail.typeUrl.lastIndexOf("/") + 1);
    if (type === "google.rpc.ErrorInfo") {
      const info = ErrorInfo.decode(detail.value);
      out.reason = info.reason;
      out.metadata = info.metadata;
    } else if (type === "google.rpc.BadRequest") {
      const bad = BadRequest.decode(detail.value);
      out.fields.push(...bad.fieldViolations.map((v) => ({ field: v.field, description: v.description })));
    }
  }
  return out;
}
