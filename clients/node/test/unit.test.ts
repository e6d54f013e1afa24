// Pure parts of the client: the event-order contract, the retry decision and status-details decoding.
import assert from "node:assert/strict";
import { test } from "node:test";

import * as grpc from "@grpc/grpc-js";

import { ERROR_TABLE, EventOrderError, SchedulerError } from "../src";
import { toSchedulerError } from "../src/errors";
import { EventOrder, type StreamEvent } from "../src/events";
import { ErrorInfoType, RetryInfoType, StatusType } from "../src/proto";
import { DEFAULT_RETRY_POLICY, retryDelay } from "../src/retry";

const queued: StreamEvent = { type: "queued", requestId: "r", positionInUserQueue: 1, modelQueueDepth: 1, priorityClass: "", estimatedWaitMs: undefined };
const dispatched: StreamEvent = { type: "dispatched", backend: "b0", dispatchedAt: undefined, queueWaitMs: 0 };
const delta: StreamEvent = { type: "delta", text: "x", tokens: 1 };
const finished: StreamEvent = {
  type: "finished",
  finishReason: "length",
  usage: { promptTokens: 1, completionTokens: 1 },
  timings: { queueWaitMs: 0, timeToFirstTokenMs: 0, totalMs: 0 },
};

function run(events: StreamEvent[]): EventOrder {
  const order = new EventOrder();
  for (const event of events) order.accept(event);
  return order;
}

test("the contract's orders are accepted, failover before the first token included", () => {
  run([queued, dispatched, delta, delta, finished]).end();
  run([queued, queued, queued, dispatched, finished]).end();
  run([queued, dispatched, queued, dispatched, delta, finished]).end();
});

test("orders that break the contract are refused", () => {
  for (const events of [[dispatched], [delta], [queued, delta], [queued, dispatched, delta, queued], [queued, dispatched, finished, delta]]) {
    assert.throws(() => run(events), EventOrderError, JSON.stringify(events.map((e) => e.type)));
  }
  assert.throws(() => run([queued, dispatched, delta]).end(), EventOrderError);
});

function error(reason: string | undefined, retryDelayMs?: number): SchedulerError {
  return new SchedulerError({ code: grpc.status.RESOURCE_EXHAUSTED, details: "", reason, domain: "llmsched.v1", retryDelayMs });
}

const noDeadline = { producedText: false, deadline: undefined };

test("a RetryInfo delay is honoured: never earlier, at most jitter later", () => {
  assert.equal(retryDelay(error("QUEUE_FULL", 1000), 1, DEFAULT_RETRY_POLICY, { ...noDeadline, random: () => 0 }), 1000);
  assert.equal(retryDelay(error("QUEUE_FULL", 1000), 1, DEFAULT_RETRY_POLICY, { ...noDeadline, random: () => 1 }), 1200);
  assert.equal(retryDelay(error("QUEUE_FULL", 60_000), 1, DEFAULT_RETRY_POLICY, noDeadline), undefined, "past maxRetryDelayMs");
});

test("without RetryInfo the backoff grows and is capped", () => {
  const delays = [1, 2, 3].map((n) => retryDelay(error("BACKEND_UNAVAILABLE"), n, { ...DEFAULT_RETRY_POLICY, maxAttempts: 9 }, { ...noDeadline, random: () => 0 }));
  assert.deepEqual(delays, [200, 400, 800]);
  const capped = retryDelay(error("BACKEND_UNAVAILABLE"), 8, { ...DEFAULT_RETRY_POLICY, maxAttempts: 9 }, { ...noDeadline, random: () => 0 });
  assert.equal(capped, DEFAULT_RETRY_POLICY.maxBackoffMs);
});

test("no retry for a non-retryable or unknown reason, after text, past the attempts or the deadline", () => {
  for (const reason of Object.keys(ERROR_TABLE) as (keyof typeof ERROR_TABLE)[]) {
    const expected = ERROR_TABLE[reason].retryable;
    assert.equal(retryDelay(error(reason, 10), 1, DEFAULT_RETRY_POLICY, noDeadline) !== undefined, expected, reason);
  }
  assert.equal(retryDelay(error("SOMETHING_NEW", 10), 1, DEFAULT_RETRY_POLICY, noDeadline), undefined);
  assert.equal(retryDelay(error(undefined, 10), 1, DEFAULT_RETRY_POLICY, noDeadline), undefined);
  assert.equal(retryDelay(error("QUEUE_FULL", 10), 1, DEFAULT_RETRY_POLICY, { producedText: true, deadline: undefined }), undefined);
  assert.equal(retryDelay(error("QUEUE_FULL", 10), DEFAULT_RETRY_POLICY.maxAttempts, DEFAULT_RETRY_POLICY, noDeadline), undefined);
  assert.equal(retryDelay(error("QUEUE_FULL", 500), 1, DEFAULT_RETRY_POLICY, { producedText: false, deadline: 1_400, now: 1_000 }), undefined);
  const foreign = new SchedulerError({ code: grpc.status.UNAVAILABLE, details: "", reason: "QUEUE_FULL", domain: "example.com" });
  assert.equal(foreign.retryable, false, "a reason of another domain is not ours");
});

test("grpc-status-details-bin decodes into reason, metadata and retry delay", () => {
  const any = (type: protobufType, typeName: string, value: object) => ({
    type_url: `type.googleapis.com/google.rpc.${typeName}`,
    value: type.encode(type.create(value)).finish(),
  });
  const status = StatusType.encode(
    StatusType.create({
      code: grpc.status.RESOURCE_EXHAUSTED,
      message: "full",
      details: [
        any(ErrorInfoType, "ErrorInfo", { reason: "QUEUE_FULL", domain: "llmsched.v1", metadata: { model: "m" } }),
        any(RetryInfoType, "RetryInfo", { retryDelay: { seconds: 1, nanos: 500_000_000 } }),
      ],
    }),
  ).finish();
  const trailers = new grpc.Metadata();
  trailers.set("grpc-status-details-bin", Buffer.from(status));
  const decoded = toSchedulerError({ code: grpc.status.RESOURCE_EXHAUSTED, details: "full", metadata: trailers });
  assert.equal(decoded.reason, "QUEUE_FULL");
  assert.equal(decoded.codeName, "RESOURCE_EXHAUSTED");
  assert.deepEqual(decoded.metadata, { model: "m" });
  assert.equal(decoded.retryDelayMs, 1500);
  assert.equal(decoded.retryable, true);
  const bare = toSchedulerError({ code: grpc.status.UNAVAILABLE, details: "no connection", metadata: new grpc.Metadata() });
  assert.equal(bare.reason, undefined);
  assert.equal(bare.retryable, false, "a status without a reason is not retried");
});

type protobufType = typeof StatusType;
