package llmsched_test

// Live tests: they run against a scheduler and simulator that tests/clients/test_go_client.py starts on
// real sockets, and skip when its environment is absent (a bare `go test`).
//
//   LLMSCHED_GO_TEST_ADDR       scheduler with API keys     LLMSCHED_GO_TEST_KEYS  user:key,user:key
//   LLMSCHED_GO_TEST_OPEN_ADDR  scheduler without (x-user-id)
//   LLMSCHED_GO_TEST_SIM_URL    the simulator behind model "m" (its /sim/stats shows aborts)
//   LLMSCHED_GO_TEST_ERRORS     the error table from llmsched/v1/errors.py, JSON reason -> [code, retryable]
// Model "m" serves at once; model "capped" runs one request at a time with one more waiting in the engine,
// holds at most one queued request per user, and so keeps a third one queued.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"llmsched.dev/client/llmsched"
	pb "llmsched.dev/client/llmschedv1"
)

func env(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		t.Skipf("%s is not set: run through tests/clients/test_go_client.py", name)
	}
	return value
}

func key(t *testing.T, user string) string {
	t.Helper()
	for _, pair := range strings.Split(env(t, "LLMSCHED_GO_TEST_KEYS"), ",") {
		if u, k, ok := strings.Cut(pair, ":"); ok && u == user {
			return k
		}
	}
	t.Fatalf("no key for %s", user)
	return ""
}

func dial(t *testing.T, opts llmsched.Options) *llmsched.Client {
	t.Helper()
	client, err := llmsched.Dial(env(t, "LLMSCHED_GO_TEST_ADDR"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func long(model string) *pb.GenerationParams {
	params := llmsched.Prompt(model, "a long story")
	params.MaxTokens, params.IgnoreEos = proto.Int32(2000), true
	return params
}

// next reads events until one of `kind` arrives, failing on an error or the end.
func next(t *testing.T, s *llmsched.Stream, kind llmsched.EventKind) llmsched.Event {
	t.Helper()
	for {
		event, err := s.Next()
		if err != nil {
			t.Fatalf("waiting for %s: %v", kind, err)
		}
		if event.Kind == kind {
			return event
		}
	}
}

func wantError(t *testing.T, err error, code codes.Code, reason string) *llmsched.Error {
	t.Helper()
	e, ok := llmsched.AsError(err)
	if !ok {
		t.Fatalf("want an *llmsched.Error %s/%s, got %T %v", code, reason, err, err)
	}
	if e.Code != code || e.Reason != reason {
		t.Fatalf("want %s/%q, got %s/%q (%s)", code, reason, e.Code, e.Reason, e.Message)
	}
	if status.Code(err) != code {
		t.Fatalf("status.Code sees %s", status.Code(err))
	}
	return e
}

func TestStreamFollowsTheEventOrder(t *testing.T) {
	for _, door := range []string{"api key", "x-user-id"} {
		t.Run(door, func(t *testing.T) {
			var client *llmsched.Client
			if door == "api key" {
				client = dial(t, llmsched.Options{APIKey: key(t, "alice")})
			} else {
				c, err := llmsched.Dial(env(t, "LLMSCHED_GO_TEST_OPEN_ADDR"), llmsched.Options{UserID: "gopher"})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				client = c
			}
			params := llmsched.Prompt("m", "count to five")
			params.MaxTokens, params.IgnoreEos, params.RequestId = proto.Int32(5), true, "go-order"
			stream := client.Stream(context.Background(), params)
			defer stream.Close()
			var kinds []string
			tokens := 0
			var finished *pb.Finished
			for {
				event, err := stream.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("after %v: %v", kinds, err)
				}
				kinds = append(kinds, event.Kind.String())
				switch event.Kind {
				case llmsched.EventQueued:
					if event.Queued.RequestId != "go-order" || event.Queued.PositionInUserQueue < 1 {
						t.Fatalf("queued event %v", event.Queued)
					}
				case llmsched.EventDelta:
					tokens += int(event.Delta.Tokens)
				case llmsched.EventFinished:
					finished = event.Finished
				}
			}
			// queued+ dispatched delta* finished, and nothing after finished.
			order := strings.Join(kinds, " ")
			i := 0
			for i < len(kinds) && kinds[i] == "queued" {
				i++
			}
			if i == 0 || i >= len(kinds) || kinds[i] != "dispatched" || kinds[len(kinds)-1] != "finished" {
				t.Fatalf("event order %s", order)
			}
			for _, k := range kinds[i+1 : len(kinds)-1] {
				if k != "delta" {
					t.Fatalf("event order %s", order)
				}
			}
			if finished.Usage.CompletionTokens != 5 || tokens != 5 || finished.FinishReason != pb.FinishReason_FINISH_REASON_LENGTH {
				t.Fatalf("finished %v after %d delta tokens", finished, tokens)
			}
			if _, err := stream.Next(); !errors.Is(err, io.EOF) {
				t.Fatalf("after the end: %v", err)
			}
		})
	}
}

func TestSubmitReturnsTheWholeAnswer(t *testing.T) {
	client := dial(t, llmsched.Options{APIKey: key(t, "alice")})
	params := llmsched.Prompt("m", "hello")
	params.MaxTokens, params.IgnoreEos = proto.Int32(4), true
	params.EndUser = "alice-customer-7" // served inside alice's share
	response, err := client.Submit(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if response.Usage.CompletionTokens != 4 || response.Text == "" || response.Backend != "b0" {
		t.Fatalf("response %v", response)
	}
}

func simStats(t *testing.T) map[string]any {
	t.Helper()
	response, err := http.Get(env(t, "LLMSCHED_GO_TEST_SIM_URL") + "/sim/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	stats := map[string]any{}
	if err := json.NewDecoder(response.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	return stats
}

func TestCancellingTheContextAbortsTheRequestInTheEngine(t *testing.T) {
	client := dial(t, llmsched.Options{APIKey: key(t, "alice")})
	abortedBefore := simStats(t)["aborted_total"].(float64)
	ctx, cancel := context.WithCancel(context.Background())
	stream := client.Stream(ctx, long("m"))
	next(t, stream, llmsched.EventDelta)
	cancel()
	_, err := stream.Next()
	wantError(t, err, codes.Canceled, "")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("errors.Is(%v, context.Canceled) is false", err)
	}
	// The engine sees the abort (no event to wait on across processes: poll its stats, with a deadline).
	deadline := time.Now().Add(10 * time.Second)
	for simStats(t)["aborted_total"].(float64) != abortedBefore+1 {
		if time.Now().After(deadline) {
			t.Fatalf("the engine never aborted the request: %v", simStats(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if running := simStats(t)["running"].(float64); running != 0 {
		t.Fatalf("%v requests still running in the engine", running)
	}
}

func TestErrorsCarryTheirReason(t *testing.T) {
	retrying := llmsched.DefaultRetryPolicy()
	attempts := 0
	retrying.OnRetry = func(int, *llmsched.Error, time.Duration) { attempts++ }

	t.Run("unknown model", func(t *testing.T) {
		client := dial(t, llmsched.Options{APIKey: key(t, "alice"), Retry: retrying})
		_, err := client.Submit(context.Background(), llmsched.Prompt("no-such-model", "hi"))
		e := wantError(t, err, codes.NotFound, "MODEL_NOT_FOUND")
		if e.Retryable() || e.ReasonValue() != pb.ErrorReason_MODEL_NOT_FOUND || attempts != 0 {
			t.Fatalf("retryable %t, reason %v, retried %d times", e.Retryable(), e.ReasonValue(), attempts)
		}
	})
	t.Run("bad key", func(t *testing.T) {
		client := dial(t, llmsched.Options{APIKey: "sk-not-a-key", Retry: retrying})
		stream := client.Stream(context.Background(), llmsched.Prompt("m", "hi"))
		_, err := stream.Next()
		wantError(t, err, codes.Unauthenticated, "UNAUTHENTICATED")
		if attempts != 0 {
			t.Fatalf("retried %d times", attempts)
		}
	})
	t.Run("malformed end user", func(t *testing.T) {
		client := dial(t, llmsched.Options{APIKey: key(t, "alice")})
		params := llmsched.Prompt("m", "hi")
		params.EndUser = "not an id"
		_, err := client.Submit(context.Background(), params)
		e := wantError(t, err, codes.InvalidArgument, "INVALID_REQUEST")
		if !strings.Contains(e.Message, "end_user") {
			t.Fatalf("message %q does not name the field", e.Message)
		}
	})
	t.Run("prompt too large", func(t *testing.T) {
		client := dial(t, llmsched.Options{APIKey: key(t, "alice")})
		_, err := client.Submit(context.Background(), llmsched.Prompt("m", strings.Repeat("x", 5000)))
		e := wantError(t, err, codes.InvalidArgument, "PROMPT_TOO_LARGE")
		if e.Metadata["max_prompt_bytes"] != "4096" {
			t.Fatalf("metadata %v", e.Metadata)
		}
	})
}

func TestQueueFullIsRetriedAfterRetryInfoAndDeadlinesEndQueuedCalls(t *testing.T) {
	alice := dial(t, llmsched.Options{APIKey: key(t, "alice")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // ends the long requests below
	running := alice.Stream(ctx, long("capped"))
	next(t, running, llmsched.EventDelta) // the engine's one slot
	waiting := alice.Stream(ctx, long("capped"))
	next(t, waiting, llmsched.EventDispatched) // the engine's waiting queue: the gate closes
	queued := alice.Stream(ctx, long("capped"))
	next(t, queued, llmsched.EventQueued) // alice's one queued request

	// Without retries: the error shows the reason and the server's hint.
	_, err := alice.Submit(ctx, llmsched.Prompt("capped", "one more"))
	full := wantError(t, err, codes.ResourceExhausted, "QUEUE_FULL")
	if !full.HasRetryDelay || full.RetryDelay <= 0 || !full.Retryable() {
		t.Fatalf("no usable retry hint: %+v", full)
	}

	// With retries: the first attempt is refused, the client waits at least the hint, then gets in once the
	// queued request is cancelled.
	policy := llmsched.DefaultRetryPolicy()
	policy.MaxAttempts = 5
	type retry struct {
		at         time.Time
		wait, hint time.Duration
	}
	var retries []retry
	policy.OnRetry = func(attempt int, err *llmsched.Error, wait time.Duration) {
		if err.Reason != "QUEUE_FULL" || !err.HasRetryDelay {
			t.Errorf("retried after %v", err)
		}
		retries = append(retries, retry{time.Now(), wait, err.RetryDelay})
		queued.Close() // makes room for the retry
	}
	retrying, err := llmsched.Dial(env(t, "LLMSCHED_GO_TEST_ADDR"), llmsched.Options{APIKey: key(t, "alice"), Retry: policy})
	if err != nil {
		t.Fatal(err)
	}
	defer retrying.Close()
	late := retrying.Stream(ctx, long("capped"))
	first, err := late.Next()
	admitted := time.Now()
	if err != nil || first.Kind != llmsched.EventQueued {
		t.Fatalf("after %d retries: %v %v", len(retries), first.Kind, err)
	}
	if len(retries) == 0 || first.Attempt != len(retries)+1 {
		t.Fatalf("attempt %d after %d retries", first.Attempt, len(retries))
	}
	last := retries[len(retries)-1]
	if last.wait < last.hint || admitted.Sub(last.at) < last.hint {
		t.Fatalf("retried %s after the refusal (planned %s), the server asked for %s", admitted.Sub(last.at), last.wait, last.hint)
	}
	late.Close()

	// A deadline ends a call that is still queued (bob has nothing queued; the gate stays closed).
	bob := dial(t, llmsched.Options{APIKey: key(t, "bob"), Retry: llmsched.DefaultRetryPolicy()})
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	started := time.Now()
	_, err = bob.Submit(short, llmsched.Prompt("capped", "in time?"))
	e, ok := llmsched.AsError(err)
	if !ok || e.Code != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want DeadlineExceeded, got %v", err)
	}
	if elapsed := time.Since(started); elapsed < 300*time.Millisecond {
		t.Fatalf("failed after %s, before its deadline", elapsed)
	}
}

func TestTheErrorTableMatchesTheService(t *testing.T) {
	var table map[string][2]any
	if err := json.Unmarshal([]byte(env(t, "LLMSCHED_GO_TEST_ERRORS")), &table); err != nil {
		t.Fatal(err)
	}
	got := llmsched.ErrorTable()
	if len(got) != len(table) {
		t.Fatalf("%d reasons here, %d in llmsched/v1/errors.py", len(got), len(table))
	}
	for reason, row := range table {
		spec, ok := got[reason]
		if !ok || int(spec.Code) != int(row[0].(float64)) || spec.Retryable != row[1].(bool) {
			t.Errorf("%s: here %+v, llmsched/v1/errors.py %v", reason, spec, row)
		}
		if _, known := pb.ErrorReason_value[reason]; !known {
			t.Errorf("%s is not an ErrorReason value", reason)
		}
	}
}
