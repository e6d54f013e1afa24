// Package llmsched is a thin client for llm-scheduler's gRPC API (llmsched.v1.SchedulerService), over the
// code protoc generates from protos/ (package llmschedv1).
//
// It adds what every caller needs: the caller's identity on every call (an API key as
// `authorization: Bearer <key>`, or `x-user-id`), typed stream events in the order the service promises,
// errors that expose the reason and retry hint of the error table, and retries that honour
// google.rpc.RetryInfo. Cancellation and deadlines come from the context: cancelling it cancels the call,
// which removes a queued request or aborts a running one inside the engine.
package llmsched

import (
	"context"
	"crypto/tls"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	pb "llmsched.dev/client/llmschedv1"
)

// Options configure a Client. Set APIKey or UserID (with API keys configured on the service, the key alone
// decides the user).
type Options struct {
	APIKey string
	UserID string
	// TLS, when set, makes Dial use TLS with this configuration (plaintext otherwise).
	TLS *tls.Config
	// Retry is used by Submit and Stream; the zero value makes one attempt only.
	Retry RetryPolicy
	// DialOptions are added to Dial's own.
	DialOptions []grpc.DialOption
}

// Client calls one llm-scheduler; it is safe for concurrent use.
type Client struct {
	stub  pb.SchedulerServiceClient
	conn  *grpc.ClientConn // nil when the caller owns the connection (New)
	meta  []string
	retry RetryPolicy
}

// Dial connects to target ("host:port"); Close releases the connection.
func Dial(target string, opts Options) (*Client, error) {
	dial := []grpc.DialOption{grpc.WithInsecure()}
	if opts.TLS != nil {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(opts.TLS))}
	}
	conn, err := grpc.Dial(target, append(dial, opts.DialOptions...)...)
	if err != nil {
		return nil, err
	}
	c := New(conn, opts)
	c.conn = conn
	return c, nil
}

// New wraps a connection the caller owns (Close then leaves it open).
func New(conn grpc.ClientConnInterface, opts Options) *Client {
	var meta []string
	if opts.APIKey != "" {
		meta = append(meta, "authorization", "Bearer "+opts.APIKey)
	}
	if opts.UserID != "" {
		meta = append(meta, "x-user-id", opts.UserID)
	}
	return &Client{stub: pb.NewSchedulerServiceClient(conn), meta: meta, retry: opts.Retry}
}

// Close closes the connection Dial opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

func (c *Client) outgoing(ctx context.Context) context.Context {
	if len(c.meta) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, c.meta...)
}

// Submit runs one generation and returns the whole answer. A failure is an *Error; retryable ones are sent
// again by the client's RetryPolicy (a Submit that failed returned no text, so a retry loses nothing).
func (c *Client) Submit(ctx context.Context, params *pb.GenerationParams) (*pb.SubmitResponse, error) {
	request := &pb.SubmitRequest{Params: params}
	for attempt := 1; ; attempt++ {
		response, err := c.stub.Submit(c.outgoing(ctx), request)
		if err == nil {
			return response, nil
		}
		err = fromRPC(err)
		wait, again := c.retry.shouldRetry(ctx, attempt, err)
		if !again {
			return nil, err
		}
		if serr := sleep(ctx, wait); serr != nil {
			return nil, serr
		}
	}
}

// QueueState returns the scheduler's queues, gates and fair-share counters (admins only when the service
// restricts it). It is not retried.
func (c *Client) QueueState(ctx context.Context, request *pb.GetQueueStateRequest) (*pb.GetQueueStateResponse, error) {
	response, err := c.stub.GetQueueState(c.outgoing(ctx), request)
	return response, fromRPC(err)
}

// Stream starts a streamed generation; read its events with Next. Cancel ctx (or call Close) to cancel it.
// Errors, including the first attempt's, arrive from Next.
func (c *Client) Stream(ctx context.Context, params *pb.GenerationParams) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	return &Stream{client: c, ctx: ctx, cancel: cancel, request: &pb.StreamRequest{Params: params}}
}

// Prompt is a GenerationParams for a plain-text prompt.
func Prompt(model, prompt string) *pb.GenerationParams {
	return &pb.GenerationParams{Model: model, Prompt: prompt}
}

var errClosed = errors.New("llmsched: stream closed")
