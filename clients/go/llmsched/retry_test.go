package llmsched

// Retry rules against a scripted in-process gRPC server on a loopback socket: what the live scheduler cannot
// be made to do on demand (fail a stream after a delta, send a reason this client does not know).

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "llmsched.dev/client/llmschedv1"
)

// script is what one Stream or Submit call of the fake server does: events to send, then an error (nil: end).
type script struct {
	events []*pb.StreamResponse
	err    error
}

type fakeServer struct {
	pb.UnimplementedSchedulerServiceServer
	mu      sync.Mutex
	scripts []script
	calls   int
	meta    []metadata.MD
}

func (f *fakeServer) take(ctx context.Context) script {
	f.mu.Lock()
	defer f.mu.Unlock()
	md, _ := metadata.FromIncomingContext(ctx)
	f.meta = append(f.meta, md)
	s := f.scripts[f.calls]
	f.calls++
	return s
}

func (f *fakeServer) Stream(_ *pb.StreamRequest, server pb.SchedulerService_StreamServer) error {
	s := f.take(server.Context())
	for _, event := range s.events {
		if err := server.Send(event); err != nil {
			return err
		}
	}
	return s.err
}

func (f *fakeServer) Submit(ctx context.Context, _ *pb.SubmitRequest) (*pb.SubmitResponse, error) {
	s := f.take(ctx)
	if s.err != nil {
		return nil, s.err
	}
	return &pb.SubmitResponse{Text: "ok"}, nil
}

func serve(t *testing.T, opts Options, scripts ...script) (*Client, *fakeServer) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeServer{scripts: scripts}
	server := grpc.NewServer()
	pb.RegisterSchedulerServiceServer(server, fake)
	go server.Serve(listener)
	t.Cleanup(server.Stop)
	client, err := Dial(listener.Addr().String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client, fake
}

func failure(code codes.Code, reason string, delay time.Duration) error {
	st := status.New(code, "scripted "+reason)
	info := &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"backend": "b0"}}
	if delay > 0 {
		st, _ = st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	} else {
		st, _ = st.WithDetails(info)
	}
	return st.Err()
}

var (
	queued     = &pb.StreamResponse{Event: &pb.StreamResponse_Queued{Queued: &pb.Queued{PositionInUserQueue: 1}}}
	dispatched = &pb.StreamResponse{Event: &pb.StreamResponse_Dispatched{Dispatched: &pb.Dispatched{Backend: "b0"}}}
	delta      = &pb.StreamResponse{Event: &pb.StreamResponse_Delta{Delta: &pb.Delta{Text: "hi", Tokens: 1}}}
	finished   = &pb.StreamResponse{Event: &pb.StreamResponse_Finished{Finished: &pb.Finished{}}}
)

func fastRetries() RetryPolicy {
	return RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, Jitter: 0.2}
}

func kinds(t *testing.T, s *Stream) ([]string, error) {
	t.Helper()
	var seen []string
	for {
		event, err := s.Next()
		if err != nil {
			return seen, err
		}
		seen = append(seen, event.Kind.String())
	}
}

func TestAStreamIsNeverRetriedAfterADelta(t *testing.T) {
	unavailable := failure(codes.Unavailable, "BACKEND_UNAVAILABLE", 0)
	client, fake := serve(t, Options{Retry: fastRetries()},
		script{[]*pb.StreamResponse{queued, dispatched, delta}, unavailable}, script{[]*pb.StreamResponse{finished}, nil})
	seen, err := kinds(t, client.Stream(context.Background(), Prompt("m", "hi")))
	e, ok := AsError(err)
	if !ok || e.Reason != "BACKEND_UNAVAILABLE" || e.Metadata["backend"] != "b0" || fake.calls != 1 {
		t.Fatalf("events %v, error %v, %d calls", seen, err, fake.calls)
	}
}

func TestAStreamIsRetriedBeforeADeltaAndSaysWhichAttempt(t *testing.T) {
	client, fake := serve(t, Options{Retry: fastRetries()},
		script{[]*pb.StreamResponse{queued, dispatched}, failure(codes.Unavailable, "BACKEND_UNAVAILABLE", 0)},
		script{[]*pb.StreamResponse{queued, dispatched, delta, finished}, nil})
	stream := client.Stream(context.Background(), Prompt("m", "hi"))
	var attempts []int
	for {
		event, err := stream.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		attempts = append(attempts, event.Attempt)
	}
	if fake.calls != 2 || len(attempts) != 6 || attempts[1] != 1 || attempts[2] != 2 || attempts[5] != 2 {
		t.Fatalf("%d calls, attempts per event %v", fake.calls, attempts)
	}
}

func TestOnlyRetryableReasonsAreRetried(t *testing.T) {
	for _, c := range []struct {
		code   codes.Code
		reason string
	}{{codes.Unavailable, "A_REASON_FROM_THE_FUTURE"}, {codes.Unavailable, ""}, {codes.InvalidArgument, "INVALID_REQUEST"}, {codes.Internal, "BACKEND_ERROR"}} {
		err := status.Error(c.code, "no details")
		if c.reason != "" {
			err = failure(c.code, c.reason, 0)
		}
		client, fake := serve(t, Options{Retry: fastRetries()}, script{nil, err}, script{nil, nil})
		_, got := client.Submit(context.Background(), Prompt("m", "hi"))
		if e, ok := AsError(got); !ok || e.Code != c.code || e.Reason != c.reason || fake.calls != 1 {
			t.Fatalf("%s/%s: %v after %d calls", c.code, c.reason, got, fake.calls)
		}
	}
}

func TestSubmitWaitsForRetryInfoAndStopsAtMaxAttempts(t *testing.T) {
	full := failure(codes.ResourceExhausted, "QUEUE_FULL", 50*time.Millisecond)
	policy := fastRetries()
	var waits []time.Duration
	policy.OnRetry = func(_ int, _ *Error, wait time.Duration) { waits = append(waits, wait) }
	client, fake := serve(t, Options{Retry: policy}, script{nil, full}, script{nil, full}, script{nil, full}, script{nil, nil})
	started := time.Now()
	_, err := client.Submit(context.Background(), Prompt("m", "hi"))
	e, ok := AsError(err)
	if !ok || e.Reason != "QUEUE_FULL" || e.RetryDelay != 50*time.Millisecond || fake.calls != 3 || len(waits) != 2 {
		t.Fatalf("%v after %d calls, waits %v", err, fake.calls, waits)
	}
	for _, w := range waits {
		if w < 50*time.Millisecond || w > 60*time.Millisecond {
			t.Fatalf("wait %s outside [hint, hint*(1+jitter)]", w)
		}
	}
	if elapsed := time.Since(started); elapsed < 100*time.Millisecond {
		t.Fatalf("three attempts in %s: the hint was not honoured", elapsed)
	}
}

func TestARetryThatCannotBeatTheDeadlineIsNotMade(t *testing.T) {
	client, fake := serve(t, Options{Retry: fastRetries()}, script{nil, failure(codes.ResourceExhausted, "QUEUE_FULL", time.Hour)}, script{nil, nil})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := client.Submit(ctx, Prompt("m", "hi"))
	if e, ok := AsError(err); !ok || e.Reason != "QUEUE_FULL" || fake.calls != 1 || ctx.Err() != nil {
		t.Fatalf("%v after %d calls", err, fake.calls)
	}
}

func TestBackoffWithoutAHintIsJitteredAndCapped(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 10, BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second, Jitter: 0.5}
	e := &Error{Reason: "BACKEND_UNAVAILABLE"}
	for attempt, max := range map[int]time.Duration{1: 100 * time.Millisecond, 3: 400 * time.Millisecond, 9: time.Second} {
		for i := 0; i < 50; i++ {
			if w := p.wait(attempt, e); w > max || w < max/2 {
				t.Fatalf("attempt %d: wait %s outside [%s, %s]", attempt, w, max/2, max)
			}
		}
	}
}

func TestIdentityTravelsOnEveryCall(t *testing.T) {
	client, fake := serve(t, Options{APIKey: "sk-1", UserID: "alice"}, script{nil, nil})
	if _, err := client.Submit(context.Background(), Prompt("m", "hi")); err != nil {
		t.Fatal(err)
	}
	md := fake.meta[0]
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer sk-1" {
		t.Fatalf("authorization %v", got)
	}
	if got := md.Get("x-user-id"); len(got) != 1 || got[0] != "alice" {
		t.Fatalf("x-user-id %v", got)
	}
}
