// The client against a live scheduler and simulators, started by tests/clients/test_node_client.py, which passes:
//   LLMSCHED_NODE_TEST_ADDRESS        the scheduler (models "m" and "capped" on SIM, "flaky" on FLAKY_SIM)
//   LLMSCHED_NODE_TEST_SIM_URL        the simulator behind "m" and "capped" (GET /sim/stats)
//   LLMSCHED_NODE_TEST_FLAKY_SIM_URL  the simulator behind "flaky" (POST/DELETE /sim/faults)
//   LLMSCHED_NODE_TEST_KEYS           {"alice": key, "carol": key}: API keys the scheduler knows
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import path from "node:path";
import { after, describe, test } from "node:test";
import { promisify } from "node:util";

import { type RetryAttempt, SchedulerClient, SchedulerError, type StreamEvent, status } from "../src";

const ADDRESS = process.env.LLMSCHED_NODE_TEST_ADDRESS ?? "";
const SIM = process.env.LLMSCHED_NODE_TEST_SIM_URL ?? "";
const FLAKY = process.env.LLMSCHED_NODE_TEST_FLAKY_SIM_URL ?? "";
const KEYS: Record<string, string> = JSON.parse(process.env.LLMSCHED_NODE_TEST_KEYS ?? "{}");
const skip = ADDRESS ? false : "no live scheduler: run through tests/clients/test_node_client.py (make test)";
const LONG = { maxTokens: 2000, ignoreEos: true };

const clients: SchedulerClient[] = [];
function client(apiKey: string | null = KEYS.alice!): SchedulerClient {
  const made = new SchedulerClient({ address: ADDRESS, ...(apiKey ? { apiKey } : {}) });
  clients.push(made);
  return made;
}
after(() => clients.forEach((c) => c.close()));

interface SimStats {
  aborted_total: number;
  running: number;
}

async function simStats(url: string): Promise<SimStats> {
  const response = await fetch(`${url}/sim/stats`);
  return (await response.json()) as SimStats;
}

async function setFaults(url: string, faults: Record<string, unknown> | null): Promise<void> {
  const response = await fetch(`${url}/sim/faults`, {
    method: faults ? "POST" : "DELETE",
    ...(faults ? { body: JSON.stringify(faults), headers: { "content-type": "application/json" } } : {}),
  });
  assert.equal(response.status, 200, await response.text());
}

/** Polls another process's state (the simulator offers no event to wait on) until it holds, with a deadline. */
async function eventually(predicate: () => Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) assert.fail(`${what} not reached within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Waits until the engine aborted `count` more generations than `before` and runs none. */
async function engineAborted(before: number, count = 1): Promise<void> {
  await eventually(async () => {
    const stats = await simStats(SIM);
    return stats.aborted_total >= before + count && stats.running === 0;
  }, `${count} abort(s) in the engine`);
}

function isError(code: status, reason: string | undefined): (error: unknown) => boolean {
  return (error) => {
    assert.ok(error instanceof SchedulerError, `not a SchedulerError: ${String(error)}`);
    assert.equal(error.codeName, status[code]);
    assert.equal(error.reason, reason);
    return true;
  };
}

describe("against a live scheduler", { skip }, () => {
  test("Stream follows the event order and Submit returns the same kind of answer", async () => {
    const events: StreamEvent[] = [];
    for await (const event of client().stream({ model: "m", prompt: "hello", maxTokens: 5, ignoreEos: true, requestId: "node-order" })) {
      events.push(event);
    }
    assert.match(events.map((e) => e.type).join(" "), /^queued( queued)* dispatched( delta)+ finished$/);
    const first = events[0]!;
    assert.ok(first.type === "queued" && first.requestId === "node-order" && first.positionInUserQueue >= 1);
    const dispatched = events.find((e) => e.type === "dispatched");
    assert.ok(dispatched?.type === "dispatched" && dispatched.backend === "b0" && dispatched.dispatchedAt instanceof Date);
    const finished = events.at(-1)!;
    assert.ok(finished.type === "finished");
    assert.equal(finished.finishReason, "length");
    assert.equal(finished.usage.completionTokens, 5);
    assert.equal(events.reduce((n, e) => n + (e.type === "delta" ? e.tokens : 0), 0), 5);
    assert.ok(finished.timings.totalMs! >= finished.timings.queueWaitMs!);

    const result = await client().submit({ model: "m", prompt: "hello", maxTokens: 4, ignoreEos: true, endUser: "customer-7" });
    assert.equal(result.usage.completionTokens, 4);
    assert.equal(result.backend, "b0");
    assert.ok(result.text.length > 0 && result.requestId.length > 0);
  });

  test("aborting the signal cancels the call, and the engine aborts the generation", async () => {
    const before = (await simStats(SIM)).aborted_total;
    const controller = new AbortController();
    const seen: string[] = [];
    await assert.rejects(async () => {
      for await (const event of client().stream({ model: "m", prompt: "a long story", ...LONG }, { signal: controller.signal })) {
        seen.push(event.type);
        if (event.type === "delta") controller.abort();
      }
    }, { name: "AbortError" });
    assert.equal(seen.at(-1), "delta");
    await engineAborted(before);
  });

  test("leaving the loop early cancels the call too", async () => {
    const before = (await simStats(SIM)).aborted_total;
    let deltas = 0;
    for await (const event of client().stream({ model: "m", prompt: "another long story", ...LONG })) {
      if (event.type === "delta" && ++deltas === 2) break;
    }
    await engineAborted(before);
  });

  test("a deadline ends the call with DEADLINE_EXCEEDED, and it is not retried", async () => {
    const before = (await simStats(SIM)).aborted_total;
    const retries: RetryAttempt[] = [];
    const started = Date.now();
    let deltas = 0;
    await assert.rejects(async () => {
      const stream = client().stream({ model: "m", prompt: "too long to wait for", ...LONG }, { timeoutMs: 1500, onRetry: (r) => retries.push(r) });
      for await (const event of stream) if (event.type === "delta") deltas++;
    }, (error: unknown) => error instanceof SchedulerError && error.code === status.DEADLINE_EXCEEDED);
    assert.ok(Date.now() - started >= 1490, "it ended before its deadline");
    assert.ok(deltas > 0, "the request never ran");
    assert.deepEqual(retries, []);
    await engineAborted(before);
  });

  test("RESOURCE_EXHAUSTED carries RetryInfo, and the retry waits for it", async () => {
    const carol = client(KEYS.carol);
    const before = (await simStats(SIM)).aborted_total;
    // A running request of 40 prompt bytes fills carol's 64-byte allowance on "capped".
    const blocker = new AbortController();
    let running!: () => void;
    const isRunning = new Promise<void>((resolve) => (running = resolve));
    const blocked = (async () => {
      try {
        for await (const event of carol.stream({ model: "capped", prompt: "b".repeat(40), ...LONG }, { signal: blocker.signal })) {
          if (event.type === "dispatched") running();
        }
      } catch (error) {
        if (!blocker.signal.aborted) throw error;
      }
    })();
    await isRunning;
    const request = { model: "capped", prompt: "s".repeat(40), maxTokens: 3, ignoreEos: true };

    let refused: SchedulerError | undefined;
    await assert.rejects(carol.submit(request, { retry: false }), (error: unknown) => {
      assert.ok(isError(status.RESOURCE_EXHAUSTED, "QUEUE_BYTES_FULL")(error) && error instanceof SchedulerError);
      refused = error;
      return true;
    });
    assert.ok(refused!.retryable && refused!.retryDelayMs! > 0, `no retry hint: ${refused!.retryDelayMs}`);

    const retries: { attempt: RetryAttempt; at: number }[] = [];
    const result = await carol.submit(request, {
      retry: { maxAttempts: 6 },
      onRetry: (attempt) => {
        retries.push({ attempt, at: Date.now() });
        blocker.abort(); // frees the bytes: the next attempt fits
      },
    });
    const resolvedAt = Date.now();
    assert.equal(result.usage.completionTokens, 3);
    assert.ok(retries.length >= 1);
    for (const { attempt } of retries) {
      assert.equal(attempt.error.reason, "QUEUE_BYTES_FULL");
      assert.ok(attempt.delayMs >= attempt.error.retryDelayMs!, `retried after ${attempt.delayMs} ms < hint ${attempt.error.retryDelayMs} ms`);
    }
    const last = retries.at(-1)!;
    assert.ok(resolvedAt - last.at >= last.attempt.delayMs, "the retry did not wait its delay");
    await blocked;
    await engineAborted(before);
  });

  test("a stream that produced text is never retried, even for a retryable reason", async () => {
    await setFaults(FLAKY, { stream_cut_after_tokens: 2 });
    try {
      const retries: RetryAttempt[] = [];
      const seen: string[] = [];
      await assert.rejects(async () => {
        for await (const event of client().stream({ model: "flaky", prompt: "cut short", ...LONG }, { onRetry: (r) => retries.push(r) })) {
          seen.push(event.type);
        }
      }, (error: unknown) => isError(status.UNAVAILABLE, "BACKEND_UNAVAILABLE")(error) && (error as SchedulerError).retryable);
      assert.ok(seen.includes("delta"), seen.join(" "));
      assert.deepEqual(retries, []);
    } finally {
      await setFaults(FLAKY, null);
    }
  });

  test("a stream that failed before its first token is retried and starts again from queued", async () => {
    await setFaults(FLAKY, { stream_cut_after_tokens: 0 });
    const cleared: Promise<void>[] = [];
    const retries: RetryAttempt[] = [];
    const seen: string[] = [];
    try {
      const stream = client().stream({ model: "flaky", prompt: "second time lucky", maxTokens: 3, ignoreEos: true }, {
        onRetry: (attempt) => {
          retries.push(attempt);
          cleared.push(setFaults(FLAKY, null));
        },
      });
      for await (const event of stream) seen.push(event.type);
    } finally {
      await Promise.all(cleared);
      await setFaults(FLAKY, null);
    }
    assert.ok(retries.length >= 1);
    assert.equal(retries[0]!.error.reason, "BACKEND_UNAVAILABLE");
    assert.match(seen.join(" "), /^queued( queued)* dispatched (queued( queued)* dispatched )+(delta )+finished$/);
  });

  test("errors are typed: a bad API key is UNAUTHENTICATED, an unknown model NOT_FOUND, a malformed end user INVALID_ARGUMENT, none retried", async () => {
    const retries: RetryAttempt[] = [];
    const onRetry = (r: RetryAttempt): number => retries.push(r);
    await assert.rejects(client("sk-wrong").submit({ model: "m", prompt: "hi" }, { onRetry }), isError(status.UNAUTHENTICATED, "UNAUTHENTICATED"));
    await assert.rejects(async () => {
      for await (const _ of client(null).stream({ model: "m", prompt: "hi" }, { onRetry })) assert.fail("no event expected");
    }, isError(status.UNAUTHENTICATED, "UNAUTHENTICATED"));
    await assert.rejects(client().submit({ model: "no-such-model", prompt: "hi" }, { onRetry }), (error: unknown) => {
      assert.ok(isError(status.NOT_FOUND, "MODEL_NOT_FOUND")(error) && error instanceof SchedulerError);
      assert.equal(error.domain, "llmsched.v1");
      assert.equal(error.retryable, false);
      return true;
    });
    await assert.rejects(client().submit({ model: "m", prompt: "hi", endUser: "not an id" }, { onRetry }), (error: unknown) => {
      assert.ok(isError(status.INVALID_ARGUMENT, "INVALID_REQUEST")(error) && error instanceof SchedulerError);
      assert.match(error.message, /end_user/);
      return true;
    });
    assert.deepEqual(retries, []);
  });

  test("the example script streams a generation", async () => {
    const script = path.resolve(__dirname, "..", "examples", "stream.js");
    const env = { ...process.env, LLMSCHED_ADDRESS: ADDRESS, LLMSCHED_API_KEY: KEYS.alice!, LLMSCHED_MODEL: "m" };
    const { stdout } = await promisify(execFile)(process.execPath, [script, "Say hello"], { env, timeout: 30_000 });
    assert.match(stdout, /^queued position=1 .*\ndispatched to b0 /m);
    assert.match(stdout, /\nfinished \(length\): \d+ tokens/);
  });
});
