// @llmsched/client: a typed Node client of llm-scheduler (gRPC llmsched.v1.SchedulerService).
export { SchedulerClient, type CallOptions, type ClientOptions, type GenerationRequest } from "./client";
export { ERROR_DOMAIN, EventOrderError, SchedulerError, isRetryableReason } from "./errors";
export type {
  DeltaEvent,
  DispatchedEvent,
  FinishReason,
  FinishedEvent,
  QueuedEvent,
  StreamEvent,
  SubmitResult,
  Timings,
  Usage,
} from "./events";
export { ERROR_TABLE, type ErrorReason, type ErrorSpec } from "./gen/errorTable";
export { DEFAULT_RETRY_POLICY, type RetryAttempt, type RetryPolicy } from "./retry";
export { status } from "@grpc/grpc-js";
