package llmsched

import (
	"context"
	"math/rand"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// RetryPolicy says how failed calls are sent again. Only errors whose reason the error table marks retryable
// are retried (QUEUE_FULL, QUEUE_BYTES_FULL, BACKEND_OVERLOADED, BACKEND_UNAVAILABLE, SHUTTING_DOWN), never a
// stream that already delivered a delta, and never past the context's deadline.
type RetryPolicy struct {
	// MaxAttempts counts the first try: 1 (or 0) means no retries.
	MaxAttempts int
	// BaseDelay and MaxDelay bound the exponential backoff used when the server sent no RetryInfo.
	BaseDelay time.Duration
	MaxDelay  time.Duration
	// Jitter spreads clients that were refused together: a RetryInfo delay d becomes a wait in
	// [d, d*(1+Jitter)] (never sooner than the server asked); a backoff b becomes one in [b*(1-Jitter), b].
	Jitter float64
	// OnRetry, when set, is called before each wait (attempt is the one that failed, 1-based).
	OnRetry func(attempt int, err *Error, wait time.Duration)
}

// DefaultRetryPolicy: 3 attempts, backoff 200 ms doubling up to 5 s, 20% jitter.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 3, BaseDelay: 200 * time.Millisecond, MaxDelay: 5 * time.Second, Jitter: 0.2}
}

var (
	jitterMu  sync.Mutex
	jitterRNG = rand.New(rand.NewSource(time.Now().UnixNano()))
)

func uniform() float64 {
	jitterMu.Lock()
	defer jitterMu.Unlock()
	return jitterRNG.Float64()
}

// wait is how long to wait after the failed attempt `attempt` (1-based) before the next.
func (p RetryPolicy) wait(attempt int, err *Error) time.Duration {
	if err.HasRetryDelay {
		return err.RetryDelay + time.Duration(float64(err.RetryDelay)*p.Jitter*uniform())
	}
	backoff := p.BaseDelay << uint(attempt-1)
	if backoff > p.MaxDelay || backoff <= 0 {
		backoff = p.MaxDelay
	}
	return backoff - time.Duration(float64(backoff)*p.Jitter*uniform())
}

// shouldRetry decides, after attempt `attempt` failed with err, whether and after how long to try again.
func (p RetryPolicy) shouldRetry(ctx context.Context, attempt int, err error) (time.Duration, bool) {
	e, ok := AsError(err)
	if !ok || attempt >= p.MaxAttempts || !e.Retryable() || ctx.Err() != nil {
		return 0, false
	}
	wait := p.wait(attempt, e)
	if deadline, has := ctx.Deadline(); has && time.Until(deadline) <= wait {
		return 0, false // the retry could not start before the deadline: give the caller the real error now
	}
	if p.OnRetry != nil {
		p.OnRetry(attempt, e, wait)
	}
	return wait, true
}

// sleep waits d or until ctx ends (then returns ctx's error, as an *Error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fromContext(ctx)
	}
}

// fromContext is ctx's end as an *Error (codes.Canceled or codes.DeadlineExceeded).
func fromContext(ctx context.Context) error {
	return fromRPC(status.FromContextError(ctx.Err()).Err())
}
