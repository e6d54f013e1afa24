// When to send a failed request again: only for a reason the error table marks retryable, never for a stream
// that already produced text, after the server's RetryInfo delay when it sent one (else exponential backoff),
// with jitter so that refused clients do not come back in step, and never past the call's deadline.
import type { SchedulerError } from "./errors";

/** How a call is retried. Every field has a default (DEFAULT_RETRY_POLICY). */
export interface RetryPolicy {
  /** Attempts in all, the first included (1: never retry). */
  maxAttempts: number;
  /** Backoff before the first retry when the server gave no RetryInfo. */
  initialBackoffMs: number;
  /** Backoff growth per attempt. */
  backoffMultiplier: number;
  /** Cap on the backoff. */
  maxBackoffMs: number;
  /** The delay is drawn uniformly from [d, d * (1 + jitter)]: never earlier than the server asked. */
  jitter: number;
  /** A RetryInfo delay longer than this is not waited for: the error is thrown at once. */
  maxRetryDelayMs: number;
}

export const DEFAULT_RETRY_POLICY: Readonly<RetryPolicy> = {
  maxAttempts: 4,
  initialBackoffMs: 200,
  backoffMultiplier: 2,
  maxBackoffMs: 5_000,
  jitter: 0.2,
  maxRetryDelayMs: 30_000,
};

/** What an `onRetry` callback learns before the client waits and tries again. */
export interface RetryAttempt {
  /** The attempt that failed (1 for the first). */
  attempt: number;
  error: SchedulerError;
  /** How long the client waits before the next attempt. */
  delayMs: number;
}

/**
 * The delay before attempt `failed + 1`, or undefined when the error must be thrown: not retryable, attempts
 * used up, text already streamed, the server's delay too long, or the next attempt would start past
 * `deadline` (epoch ms).
 */
export function retryDelay(
  error: SchedulerError,
  failed: number,
  policy: RetryPolicy,
  opts: { producedText: boolean; deadline: number | undefined; now?: number; random?: () => number },
): number | undefined {
  if (opts.producedText || !error.retryable || failed >= policy.maxAttempts) return undefined;
  let base: number;
  if (error.retryDelayMs !== undefined) {
    if (error.retryDelayMs > policy.maxRetryDelayMs) return undefined;
    base = error.retryDelayMs;
  } else {
    base = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * policy.backoffMultiplier ** (failed - 1));
  }
  const delay = base * (1 + policy.jitter * (opts.random ?? Math.random)());
  if (opts.deadline !== undefined && (opts.now ?? Date.now()) + delay >= opts.deadline) return undefined;
  return delay;
}

/** Resolves after `ms`, or rejects with the signal's reason as soon as it aborts. */
export function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
