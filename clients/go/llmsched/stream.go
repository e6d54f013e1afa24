package llmsched

import (
	"context"
	"errors"
	"io"

	pb "llmsched.dev/client/llmschedv1"
)

// EventKind says which event of a stream an Event is.
type EventKind int

// The events of a stream, in the order the service sends them: Queued once at admission and again while the
// position changes, Dispatched once, Delta zero or more times, Finished once on success. A failure ends the
// stream with an *Error instead of Finished. Dispatched comes once an engine took the request; Queued and
// Dispatched come again when the request is sent on after an engine failed it before its first token (an
// attempt refused outright is not announced), or when the client retried a stream that had produced no
// delta (Event.Attempt then grows).
const (
	EventQueued EventKind = iota + 1
	EventDispatched
	EventDelta
	EventFinished
)

func (k EventKind) String() string {
	switch k {
	case EventQueued:
		return "queued"
	case EventDispatched:
		return "dispatched"
	case EventDelta:
		return "delta"
	case EventFinished:
		return "finished"
	}
	return "unknown"
}

// Event is one event of a stream; the field named by Kind is set.
type Event struct {
	Kind       EventKind
	Attempt    int // 1 unless the client retried the stream
	Queued     *pb.Queued
	Dispatched *pb.Dispatched
	Delta      *pb.Delta
	Finished   *pb.Finished
}

// ErrNoFinished: the service closed the stream without `finished` or an error (it never should).
var ErrNoFinished = errors.New("llmsched: stream ended without a finished event")

// Stream is one streamed generation. Next returns its events; it is not safe for concurrent use.
type Stream struct {
	client   *Client
	ctx      context.Context
	cancel   context.CancelFunc
	request  *pb.StreamRequest
	call     pb.SchedulerService_StreamClient
	attempt  int
	sawDelta bool
	finished bool
	done     error
}

// Next returns the next event; io.EOF after Finished, an *Error when the call failed (Code Canceled or
// DeadlineExceeded when ctx ended it). A failure before any delta is retried by the client's RetryPolicy when
// its reason is retryable; once a delta was delivered it never is (the text would repeat).
func (s *Stream) Next() (Event, error) {
	if s.done != nil {
		return Event{}, s.done
	}
	for {
		if s.call == nil {
			s.attempt++
			call, err := s.client.stub.Stream(s.client.outgoing(s.ctx), s.request)
			if err != nil {
				if s.retry(err) {
					continue
				}
				return Event{}, s.end(err)
			}
			s.call = call
		}
		msg, err := s.call.Recv()
		if err == io.EOF {
			if s.finished {
				return Event{}, s.end(io.EOF)
			}
			return Event{}, s.end(ErrNoFinished)
		}
		if err != nil {
			s.call = nil
			if !s.sawDelta && !s.finished && s.retry(err) {
				continue
			}
			return Event{}, s.end(err)
		}
		if event, ok := s.event(msg); ok {
			return event, nil
		}
	}
}

// Close cancels the stream (a queued request leaves the queue, a running one is aborted in the engine).
func (s *Stream) Close() {
	if s.done == nil {
		s.done = errClosed
	}
	s.cancel()
}

func (s *Stream) event(msg *pb.StreamResponse) (Event, bool) {
	event := Event{Attempt: s.attempt}
	switch e := msg.GetEvent().(type) {
	case *pb.StreamResponse_Queued:
		event.Kind, event.Queued = EventQueued, e.Queued
	case *pb.StreamResponse_Dispatched:
		event.Kind, event.Dispatched = EventDispatched, e.Dispatched
	case *pb.StreamResponse_Delta:
		event.Kind, event.Delta = EventDelta, e.Delta
		s.sawDelta = true
	case *pb.StreamResponse_Finished:
		event.Kind, event.Finished = EventFinished, e.Finished
		s.finished = true
	default:
		return event, false // an event kind newer than this client: skip it
	}
	return event, true
}

// retry waits before the next attempt and says whether to make one.
func (s *Stream) retry(err error) bool {
	wait, again := s.client.retry.shouldRetry(s.ctx, s.attempt, fromRPC(err))
	return again && sleep(s.ctx, wait) == nil
}

// end records the stream's last word and releases the call.
func (s *Stream) end(err error) error {
	s.done = fromRPC(err)
	if err == io.EOF || err == ErrNoFinished {
		s.done = err
	}
	s.cancel()
	return s.done
}
