// Command llmsched-go streams one prompt through llm-scheduler and prints the events: the queue position
// while waiting (on stderr), then the generated text (on stdout).
//
//	llmsched-go -addr 127.0.0.1:50051 -model m -user alice "Tell me a story"
//	LLMSCHED_API_KEY=sk-... llmsched-go -model m "Tell me a story"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"llmsched.dev/client/llmsched"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "the scheduler's gRPC address")
	model := flag.String("model", "m", "model name")
	user := flag.String("user", "", "user id sent as x-user-id (without API keys)")
	maxTokens := flag.Int("max-tokens", 0, "tokens to generate (0: the model's default)")
	class := flag.String("class", "", "priority class (empty: the default)")
	endUser := flag.String("end-user", "", "the end user the call is for, inside the user's share (empty: none)")
	timeout := flag.Duration("timeout", 0, "deadline for the whole call (0: none)")
	retries := flag.Int("attempts", 3, "attempts for retryable failures (1: no retries)")
	flag.Parse()
	prompt := strings.Join(flag.Args(), " ")
	if prompt == "" {
		fmt.Fprintln(os.Stderr, "usage: llmsched-go [flags] PROMPT")
		os.Exit(2)
	}
	policy := llmsched.DefaultRetryPolicy()
	policy.MaxAttempts = *retries
	policy.OnRetry = func(attempt int, err *llmsched.Error, wait time.Duration) {
		fmt.Fprintf(os.Stderr, "attempt %d failed (%s), retrying in %s\n", attempt, err.Reason, wait.Round(time.Millisecond))
	}
	client, err := llmsched.Dial(*addr, llmsched.Options{APIKey: os.Getenv("LLMSCHED_API_KEY"), UserID: *user, Retry: policy})
	if err != nil {
		fail(err)
	}
	defer client.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt) // Ctrl-C cancels the request
	defer stop()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	params := llmsched.Prompt(*model, prompt)
	params.PriorityClass = *class
	params.EndUser = *endUser
	if *maxTokens > 0 {
		params.MaxTokens = proto.Int32(int32(*maxTokens))
	}
	stream := client.Stream(ctx, params)
	defer stream.Close()
	midLine := false // text printed without its final newline
	for {
		event, err := stream.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			if midLine {
				fmt.Println()
			}
			fail(err)
		}
		switch event.Kind {
		case llmsched.EventQueued:
			q := event.Queued
			fmt.Fprintf(os.Stderr, "queued: position %d, %d queued for the model", q.PositionInUserQueue, q.ModelQueueDepth)
			if q.EstimatedWait != nil {
				fmt.Fprintf(os.Stderr, ", about %s", q.EstimatedWait.AsDuration().Round(100*time.Millisecond))
			}
			fmt.Fprintln(os.Stderr)
		case llmsched.EventDispatched:
			fmt.Fprintf(os.Stderr, "dispatched to %s after %s\n", event.Dispatched.Backend,
				event.Dispatched.QueueWait.AsDuration().Round(time.Millisecond))
		case llmsched.EventDelta:
			fmt.Print(event.Delta.Text)
			midLine = true
		case llmsched.EventFinished:
			f := event.Finished
			fmt.Println()
			midLine = false
			fmt.Fprintf(os.Stderr, "finished: %s, %d tokens\n", f.FinishReason, f.Usage.GetCompletionTokens())
		}
	}
}

func fail(err error) {
	if e, ok := llmsched.AsError(err); ok {
		fmt.Fprintf(os.Stderr, "error: %s reason=%s retryable=%t", e.Code, e.Reason, e.Retryable())
		if e.HasRetryDelay {
			fmt.Fprintf(os.Stderr, " retry_after=%s", e.RetryDelay)
		}
		fmt.Fprintf(os.Stderr, ": %s\n", e.Message)
	} else {
		fmt.Fprintln(os.Stderr, "error:", err)
	}
	os.Exit(1)
}
