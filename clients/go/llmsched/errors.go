package llmsched

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "llmsched.dev/client/llmschedv1"
)

// ErrorDomain is google.rpc.ErrorInfo.domain on every error status of the service.
const ErrorDomain = "llmsched.v1"

// ReasonSpec is one row of the error table (llmsched/v1/errors.py, docs/api.md): the gRPC code a reason travels
// with and whether the same request may succeed when sent again.
type ReasonSpec struct {
	Code      codes.Code
	Retryable bool
}

// errorTable mirrors llmsched/v1/errors.py; tests/clients/test_go_client.py checks that they agree.
var errorTable = map[string]ReasonSpec{
	"INVALID_REQUEST":          {codes.InvalidArgument, false},
	"MALFORMED_REQUEST":        {codes.InvalidArgument, false},
	"PROMPT_TOO_LARGE":         {codes.InvalidArgument, false},
	"MODEL_NOT_FOUND":          {codes.NotFound, false},
	"UNAUTHENTICATED":          {codes.Unauthenticated, false},
	"PERMISSION_DENIED":        {codes.PermissionDenied, false},
	"REQUEST_ID_IN_USE":        {codes.AlreadyExists, false},
	"QUEUE_FULL":               {codes.ResourceExhausted, true},
	"QUEUE_BYTES_FULL":         {codes.ResourceExhausted, true},
	"QUEUE_TIMEOUT":            {codes.DeadlineExceeded, false},
	"SHUTTING_DOWN":            {codes.Unavailable, true},
	"BACKEND_UNAVAILABLE":      {codes.Unavailable, true},
	"BACKEND_OVERLOADED":       {codes.ResourceExhausted, true},
	"BACKEND_REJECTED_REQUEST": {codes.InvalidArgument, false},
	"BACKEND_PROTOCOL_ERROR":   {codes.Internal, false},
	"BACKEND_ERROR":            {codes.Internal, false},
	"INTERNAL":                 {codes.Internal, false},
	"READ_TIMEOUT":             {codes.DeadlineExceeded, true},
	"READ_CAPACITY_FULL":       {codes.Unavailable, true},
	"DEADLINE_EXCEEDED":        {codes.DeadlineExceeded, false},
	"BACKEND_NOT_FOUND":        {codes.NotFound, false},
	"CONFIG_INVALID":           {codes.FailedPrecondition, false},
	"CONFIG_NEEDS_RESTART":     {codes.FailedPrecondition, false},
	"UNSUPPORTED_CONTENT_TYPE": {codes.InvalidArgument, false},
}

// Error is a failed call: the gRPC code, the reason (an llmsched.v1.ErrorReason value name, from
// google.rpc.ErrorInfo; empty when the status carried none, e.g. a deadline or cancellation on the client's
// side), the ErrorInfo metadata (e.g. "backend", "max_prompt_bytes") and the server's retry hint.
type Error struct {
	Code     codes.Code
	Reason   string
	Message  string
	Metadata map[string]string
	// RetryDelay is google.rpc.RetryInfo's delay; HasRetryDelay says whether the server sent one.
	RetryDelay    time.Duration
	HasRetryDelay bool
	status        *status.Status
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("llmsched: %s (%s): %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("llmsched: %s: %s", e.Code, e.Message)
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// Unwrap makes errors.Is(err, context.Canceled / context.DeadlineExceeded) hold for those codes.
func (e *Error) Unwrap() error {
	switch e.Code {
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	}
	return nil
}

// ReasonValue is Reason as the generated enum (ERROR_REASON_UNSPECIFIED when absent or unknown).
func (e *Error) ReasonValue() pb.ErrorReason {
	return pb.ErrorReason(pb.ErrorReason_value[e.Reason])
}

// Retryable says whether the same request may succeed when sent again, by the error table; a reason this
// client does not know (or none) is never retryable.
func (e *Error) Retryable() bool {
	spec, ok := errorTable[e.Reason]
	return ok && spec.Retryable
}

// ErrorTable returns a copy of the error table this client follows, by reason.
func ErrorTable() map[string]ReasonSpec {
	table := make(map[string]ReasonSpec, len(errorTable))
	for reason, spec := range errorTable {
		table[reason] = spec
	}
	return table
}

// AsError returns err as an *Error when it is one (or wraps one).
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// fromRPC turns a gRPC error into an *Error, reading ErrorInfo (of our domain) and RetryInfo from the status
// details. Errors that carry no status (none should) pass through unchanged.
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := AsError(err); ok {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	e := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, status: st}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				e.Reason = d.GetReason()
				for k, v := range d.GetMetadata() {
					e.Metadata[k] = v
				}
			}
		case *errdetails.RetryInfo:
			if d.GetRetryDelay() != nil {
				e.RetryDelay, e.HasRetryDelay = d.GetRetryDelay().AsDuration(), true
			}
		}
	}
	return e
}
