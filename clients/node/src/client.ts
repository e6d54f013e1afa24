// SchedulerClient: Submit and Stream with identity on every call, deadlines, cancellation and retries.
import * as grpc from "@grpc/grpc-js";

import { toSchedulerError } from "./errors";
import { EventOrder, type StreamEvent, type SubmitResult, toEvent, toSubmitResult } from "./events";
import type { GenerationParams } from "./gen/types/llmsched/v1/GenerationParams";
import type { SubmitResponse__Output } from "./gen/types/llmsched/v1/SubmitResponse";
import { SchedulerServiceStub, type SchedulerServiceClient } from "./proto";
import { DEFAULT_RETRY_POLICY, type RetryAttempt, type RetryPolicy, retryDelay, sleep } from "./retry";

/** What to generate: GenerationParams of llmsched.v1 (camelCase), `model` required. */
export type GenerationRequest = GenerationParams & { model: string };

export interface ClientOptions {
  /** host:port of the scheduler. */
  address: string;
  /** Sent as `authorization: Bearer <key>`; with API keys configured the key alone decides the user. */
  apiKey?: string;
  /** Sent as `x-user-id` (deployments without API keys). */
  userId?: string;
  /** Channel credentials; default: plaintext (grpc.credentials.createInsecure()). */
  credentials?: grpc.ChannelCredentials;
  /** Extra grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
  /** Default retry policy of every call (false: never retry). */
  retry?: Partial<RetryPolicy> | false;
  /** Default deadline of every call, in ms from its start (attempts and waits between them included). */
  timeoutMs?: number;
}

export interface CallOptions {
  /** Aborting cancels the call (a queued request leaves the queue, a running one is aborted in the engine);
   * the call then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Deadline in ms from now, for all attempts together; sent to the server as the call's deadline. */
  timeoutMs?: number;
  /** Absolute deadline (wins over timeoutMs). */
  deadline?: Date;
  /** This call's retry policy (merged over the client's; false: never retry). */
  retry?: Partial<RetryPolicy> | false;
  /** Called before each retry, with the error and the delay about to be waited. */
  onRetry?: (attempt: RetryAttempt) => void;
  /** Extra call metadata (ASCII values). */
  metadata?: Readonly<Record<string, string>>;
}

/** A typed client of one llm-scheduler (gRPC service llmsched.v1.SchedulerService). */
export class SchedulerClient {
  private readonly stub: SchedulerServiceClient;
  private readonly options: ClientOptions;

  constructor(options: ClientOptions) {
    this.options = options;
    this.stub = new SchedulerServiceStub(
      options.address,
      options.credentials ?? grpc.credentials.createInsecure(),
      options.channelOptions,
    );
  }

  /** Closes the channel; calls in flight fail with CANCELLED. */
  close(): void {
    this.stub.close();
  }

  /** Runs one generation and returns the whole answer. Rejects with a SchedulerError. */
  async submit(request: GenerationRequest, options: CallOptions = {}): Promise<SubmitResult> {
    const call = this.prepare(options);
    for (let attempt = 1; ; attempt++) {
      try {
        return toSubmitResult(await this.submitOnce(request, call));
      } catch (error) {
        await this.beforeRetry(error, attempt, false, call);
      }
    }
  }

  /**
   * Streams one generation: `queued` (at admission, then on position changes), `dispatched`, `delta`*, `finished`.
   * A failure throws a SchedulerError instead of `finished`. Leaving the loop early (break, return, throw)
   * cancels the call. A retried stream starts again with `queued`; one that produced a delta is never retried.
   */
  async *stream(request: GenerationRequest, options: CallOptions = {}): AsyncGenerator<StreamEvent, void, undefined> {
    const call = this.prepare(options);
    for (let attempt = 1; ; attempt++) {
      throwIfAborted(call.signal);
      const order = new EventOrder();
      const stream = this.stub.Stream({ params: request }, call.metadata, call.grpcOptions);
      const cancel = (): void => stream.cancel();
      call.signal?.addEventListener("abort", cancel, { once: true });
      try {
        for await (const message of stream) {
          const event = toEvent(message);
          order.accept(event);
          yield event;
        }
        order.end();
        return;
      } catch (error) {
        await this.beforeRetry(error, attempt, order.producedText, call);
      } finally {
        call.signal?.removeEventListener("abort", cancel);
        stream.cancel(); // no-op once the call ended; cancels it when the consumer left early
      }
    }
  }

  private prepare(options: CallOptions): PreparedCall {
    const timeoutMs = options.timeoutMs ?? this.options.timeoutMs;
    const deadline = options.deadline?.getTime() ?? (timeoutMs !== undefined ? Date.now() + timeoutMs : undefined);
    const policy =
      options.retry === false || this.options.retry === false
        ? { ...DEFAULT_RETRY_POLICY, maxAttempts: 1 }
        : { ...DEFAULT_RETRY_POLICY, ...this.options.retry, ...options.retry };
    return {
      signal: options.signal,
      deadline,
      policy,
      onRetry: options.onRetry,
      metadata: this.metadata(options.metadata),
      grpcOptions: deadline !== undefined ? { deadline } : {},
    };
  }

  private metadata(extra: Readonly<Record<string, string>> | undefined): grpc.Metadata {
    const metadata = new grpc.Metadata();
    for (const [key, value] of Object.entries(extra ?? {})) metadata.set(key, value);
    if (this.options.userId) metadata.set("x-user-id", this.options.userId);
    if (this.options.apiKey) metadata.set("authorization", `Bearer ${this.options.apiKey}`);
    return metadata;
  }

  private submitOnce(request: GenerationRequest, call: PreparedCall): Promise<SubmitResponse__Output> {
    throwIfAborted(call.signal);
    return new Promise((resolve, reject) => {
      const cancel = (): void => unary.cancel();
      const unary = this.stub.Submit({ params: request }, call.metadata, call.grpcOptions, (error, response) => {
        call.signal?.removeEventListener("abort", cancel);
        if (call.signal?.aborted) reject(call.signal.reason);
        else if (error || !response) reject(toSchedulerError(error));
        else resolve(response);
      });
      call.signal?.addEventListener("abort", cancel, { once: true });
    });
  }

  /** Waits before the next attempt, or throws: the signal's reason once aborted, else the call's error. */
  private async beforeRetry(error: unknown, attempt: number, producedText: boolean, call: PreparedCall): Promise<void> {
    throwIfAborted(call.signal);
    const failure = toSchedulerError(error);
    const delayMs = retryDelay(failure, attempt, call.policy, { producedText, deadline: call.deadline });
    if (delayMs === undefined) throw failure;
    call.onRetry?.({ attempt, error: failure, delayMs });
    await sleep(delayMs, call.signal);
  }
}

interface PreparedCall {
  signal: AbortSignal | undefined;
  deadline: number | undefined;
  policy: RetryPolicy;
  onRetry: ((attempt: RetryAttempt) => void) | undefined;
  metadata: grpc.Metadata;
  grpcOptions: grpc.CallOptions;
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) throw signal.reason;
}
