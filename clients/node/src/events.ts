// Stream events as plain typed objects, and the event-order contract of SchedulerService.Stream:
//   queued (once at admission), queued* (updates), dispatched, delta*, finished
// where a failover before the first token may start again from a new `queued` (after `dispatched`, or after
// `queued` when the engine refused the attempt outright: the server announces only attempts an engine took).
import { EventOrderError } from "./errors";
import type { Duration__Output } from "./gen/types/google/protobuf/Duration";
import type { Timestamp__Output } from "./gen/types/google/protobuf/Timestamp";
import type { StreamResponse__Output } from "./gen/types/llmsched/v1/StreamResponse";
import type { SubmitResponse__Output } from "./gen/types/llmsched/v1/SubmitResponse";
import type { Timings__Output } from "./gen/types/llmsched/v1/Timings";
import type { Usage__Output } from "./gen/types/llmsched/v1/Usage";

/** Why a generation ended. */
export type FinishReason = "stop" | "length" | "unspecified";

/** Token counts of one generation. */
export interface Usage {
  /** Prompt tokens as the engine counted them (undefined when it does not say). */
  promptTokens: number | undefined;
  completionTokens: number;
}

/** Where the time of one request went, in milliseconds, as the scheduler measured it. */
export interface Timings {
  queueWaitMs: number | undefined;
  /** Undefined when no token was generated. */
  timeToFirstTokenMs: number | undefined;
  totalMs: number | undefined;
  /** From sending the request to the engine until it answered (its front end took it in); undefined when it never did. */
  engineAcceptMs?: number;
}

/** The request waits in the scheduler's queue (first at admission, then whenever its position changes). */
export interface QueuedEvent {
  type: "queued";
  requestId: string;
  /** 1-based position among this user's queued requests for the model and class. */
  positionInUserQueue: number;
  /** Requests queued for the model, all users and classes. */
  modelQueueDepth: number;
  priorityClass: string;
  /** Estimated wait until dispatch (undefined while the drain rate is unknown). */
  estimatedWaitMs: number | undefined;
}

/** An engine took the request (the server sends this once the engine answered it). */
export interface DispatchedEvent {
  type: "dispatched";
  backend: string;
  dispatchedAt: Date | undefined;
  queueWaitMs: number | undefined;
}

/** A chunk of generated text. */
export interface DeltaEvent {
  type: "delta";
  text: string;
  tokens: number;
}

/** The generation ended successfully (the last event). */
export interface FinishedEvent {
  type: "finished";
  finishReason: FinishReason;
  usage: Usage;
  timings: Timings;
}

/** One event of a streamed generation. */
export type StreamEvent = QueuedEvent | DispatchedEvent | DeltaEvent | FinishedEvent;

/** What Submit returns. */
export interface SubmitResult {
  requestId: string;
  text: string;
  finishReason: FinishReason;
  usage: Usage;
  timings: Timings;
  /** The configured name of the engine that served the request. */
  backend: string;
}

export function durationMs(d: Duration__Output | null | undefined): number | undefined {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : undefined;
}

function timestamp(t: Timestamp__Output | null | undefined): Date | undefined {
  return t ? new Date(Number(t.seconds) * 1000 + Math.floor(t.nanos / 1e6)) : undefined;
}

function finishReason(reason: string): FinishReason {
  if (reason === "FINISH_REASON_STOP") return "stop";
  if (reason === "FINISH_REASON_LENGTH") return "length";
  return "unspecified";
}

function usage(u: Usage__Output | null): Usage {
  return { promptTokens: u?.promptTokens ?? undefined, completionTokens: u?.completionTokens ?? 0 };
}

function timings(t: Timings__Output | null): Timings {
  return {
    queueWaitMs: durationMs(t?.queueWait),
    timeToFirstTokenMs: durationMs(t?.timeToFirstToken),
    totalMs: durationMs(t?.total),
    engineAcceptMs: durationMs(t?.engineAccept),
  };
}

/** A wire StreamResponse as a typed event; a message with no event set breaks the contract. */
export function toEvent(message: StreamResponse__Output): StreamEvent {
  switch (message.event) {
    case "queued": {
      const q = message.queued!;
      return {
        type: "queued",
        requestId: q.requestId,
        positionInUserQueue: q.positionInUserQueue,
        modelQueueDepth: q.modelQueueDepth,
        priorityClass: q.priorityClass,
        estimatedWaitMs: durationMs(q.estimatedWait),
      };
    }
    case "dispatched": {
      const d = message.dispatched!;
      return {
        type: "dispatched",
        backend: d.backend,
        dispatchedAt: timestamp(d.dispatchedAt),
        queueWaitMs: durationMs(d.queueWait),
      };
    }
    case "delta":
      return { type: "delta", text: message.delta!.text, tokens: message.delta!.tokens };
    case "finished": {
      const f = message.finished!;
      return { type: "finished", finishReason: finishReason(f.finishReason), usage: usage(f.usage), timings: timings(f.timings) };
    }
    default:
      throw new EventOrderError("a StreamResponse without an event");
  }
}

export function toSubmitResult(r: SubmitResponse__Output): SubmitResult {
  return {
    requestId: r.requestId,
    text: r.text,
    finishReason: finishReason(r.finishReason),
    usage: usage(r.usage),
    timings: timings(r.timings),
    backend: r.backend,
  };
}

type Phase = "start" | "queued" | "dispatched" | "streaming" | "finished";

/** Checks one stream's events against the contract; throws EventOrderError at the first violation. */
export class EventOrder {
  private phase: Phase = "start";

  /** Whether a delta was seen (a stream that produced text is never retried). */
  get producedText(): boolean {
    return this.phase === "streaming" || this.phase === "finished";
  }

  accept(event: StreamEvent): void {
    const allowed: Record<Phase, readonly StreamEvent["type"][]> = {
      start: ["queued"],
      queued: ["queued", "dispatched"],
      dispatched: ["queued", "delta", "finished"], // queued again: failover before the first token
      streaming: ["delta", "finished"],
      finished: [],
    };
    if (!allowed[this.phase].includes(event.type)) {
      throw new EventOrderError(`${event.type} after ${this.phase === "start" ? "nothing" : this.phase}`);
    }
    this.phase = event.type === "delta" ? "streaming" : event.type;
  }

  /** The call ended with OK: it must have ended with `finished`. */
  end(): void {
    if (this.phase !== "finished") throw new EventOrderError(`the stream ended OK without finished (last: ${this.phase})`);
  }
}
