// Typed errors: every failed call becomes a SchedulerError that says what the error table says about it.
//
//   Error
//   └── SchedulerError        a call ended with a non-OK gRPC status: code, reason, ErrorInfo metadata, retry delay
//       └── EventOrderError   the server broke the Stream event-order contract (code INTERNAL, no reason)
//
// A call cancelled through its AbortSignal rejects with the signal's reason instead (as fetch does).
import * as grpc from "@grpc/grpc-js";

import { ERROR_TABLE, type ErrorReason } from "./gen/errorTable";
import { ErrorInfoType, RetryInfoType, StatusType } from "./proto";

/** google.rpc.ErrorInfo.domain of the scheduler's errors. */
export const ERROR_DOMAIN = "llmsched.v1";
const STATUS_DETAILS_KEY = "grpc-status-details-bin";
const TYPE_PREFIX = "type.googleapis.com/";

/** The fields of a SchedulerError (also what tests and logs read). */
export interface SchedulerErrorInit {
  code: grpc.status;
  details: string;
  reason?: string | undefined;
  domain?: string | undefined;
  metadata?: Readonly<Record<string, string>>;
  retryDelayMs?: number | undefined;
  trailers?: grpc.Metadata | undefined;
}

/** A call that ended with an error status, decoded. */
export class SchedulerError extends Error {
  /** The gRPC status code (grpc.status.RESOURCE_EXHAUSTED...). */
  readonly code: grpc.status;
  /** The code's name ("RESOURCE_EXHAUSTED"...). */
  readonly codeName: string;
  /** google.rpc.ErrorInfo.reason: the name of an llmsched.v1.ErrorReason; undefined when the status carried
   * none (e.g. the client's own deadline, a connection that never opened). */
  readonly reason: ErrorReason | (string & {}) | undefined;
  /** google.rpc.ErrorInfo.domain ("llmsched.v1" for the scheduler's errors). */
  readonly domain: string | undefined;
  /** google.rpc.ErrorInfo.metadata (e.g. `backend`, `max_prompt_bytes`). */
  readonly metadata: Readonly<Record<string, string>>;
  /** google.rpc.RetryInfo.retry_delay in milliseconds, when the server sent one (RESOURCE_EXHAUSTED). */
  readonly retryDelayMs: number | undefined;
  /** The status message. */
  readonly details: string;
  /** The call's trailing metadata, when there was a call. */
  readonly trailers: grpc.Metadata | undefined;

  constructor(init: SchedulerErrorInit) {
    const codeName = grpc.status[init.code] ?? String(init.code);
    super(`${codeName}${init.reason ? ` (${init.reason})` : ""}: ${init.details}`);
    this.name = new.target.name;
    this.code = init.code;
    this.codeName = codeName;
    this.reason = init.reason;
    this.domain = init.domain;
    this.metadata = init.metadata ?? {};
    this.retryDelayMs = init.retryDelayMs;
    this.details = init.details;
    this.trailers = init.trailers;
  }

  /** Whether the same request may succeed when sent again, by the error table; a reason this client does
   * not know (or none, or one from another domain) is never retryable. */
  get retryable(): boolean {
    return this.domain === ERROR_DOMAIN && isRetryableReason(this.reason);
  }
}

/** The server broke the Stream event-order contract (queued, dispatched, delta*, finished). */
export class EventOrderError extends SchedulerError {
  constructor(message: string) {
    super({ code: grpc.status.INTERNAL, details: `event order: ${message}` });
  }
}

/** Whether `reason` is an ErrorReason the table marks retryable. */
export function isRetryableReason(reason: string | undefined): boolean {
  if (reason === undefined || !Object.hasOwn(ERROR_TABLE, reason)) return false;
  return ERROR_TABLE[reason as ErrorReason].retryable;
}

/** A grpc-js ServiceError (or anything thrown by a call) as a SchedulerError, its status details decoded. */
export function toSchedulerError(error: unknown): SchedulerError {
  if (error instanceof SchedulerError) return error;
  const service = error as Partial<grpc.ServiceError>;
  if (typeof service.code !== "number") {
    return new SchedulerError({ code: grpc.status.UNKNOWN, details: String(error) });
  }
  const trailers = service.metadata instanceof grpc.Metadata ? service.metadata : undefined;
  return new SchedulerError({
    code: service.code,
    details: service.details ?? "",
    trailers,
    ...decodeDetails(trailers),
  });
}

interface DecodedDetails {
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  retryDelayMs?: number;
}

/** ErrorInfo and RetryInfo out of `grpc-status-details-bin` (a google.rpc.Status); undecodable: nothing. */
function decodeDetails(trailers: grpc.Metadata | undefined): DecodedDetails {
  const raw = trailers?.get(STATUS_DETAILS_KEY)[0];
  if (!(raw instanceof Buffer)) return {};
  const decoded: DecodedDetails = {};
  try {
    const status = StatusType.toObject(StatusType.decode(new Uint8Array(raw)), { longs: Number, defaults: true }) as {
      // google.protobuf.Any comes from protobufjs's bundled well-known types, which keep proto field names.
      details: { type_url: string; value: Uint8Array }[];
    };
    for (const any of status.details) {
      const url = any.type_url;
      const typeName = url.startsWith(TYPE_PREFIX) ? url.slice(TYPE_PREFIX.length) : url;
      if (typeName === "google.rpc.ErrorInfo" && decoded.reason === undefined) {
        const info = ErrorInfoType.toObject(ErrorInfoType.decode(any.value), { defaults: true }) as {
          reason: string;
          domain: string;
          metadata: Record<string, string>;
        };
        decoded.reason = info.reason;
        decoded.domain = info.domain;
        decoded.metadata = { ...info.metadata };
      } else if (typeName === "google.rpc.RetryInfo" && decoded.retryDelayMs === undefined) {
        const info = RetryInfoType.toObject(RetryInfoType.decode(any.value), { longs: Number, defaults: true }) as {
          retryDelay?: { seconds: number; nanos: number } | null;
        };
        if (info.retryDelay) decoded.retryDelayMs = info.retryDelay.seconds * 1000 + info.retryDelay.nanos / 1e6;
      }
    }
  } catch {
    return {}; // a details blob we cannot read: the code and message still stand
  }
  return decoded;
}
