package jetstream

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// ErrUnavailable is matched by every error that IsTransient classifies: NATS
// or JetStream could not serve the operation now (disconnected, reconnecting,
// closed, no answer in time, JetStream without a leader or out of
// resources). Trying again later is the remedy, and for a start it is safe
// with the same run ID: the first attempt either happened, and the retry
// finds its run, or it did not, and the retry makes it.
var ErrUnavailable = errors.New("jetflow: NATS unavailable, retry later")

// JetStream API error codes that say "not now" rather than "never".
const (
	errCodeClusterNotAvailable natsjs.ErrorCode = 10008 // JSClusterNotAvailErr
	errCodeInsufficientRes     natsjs.ErrorCode = 10023 // JSInsufficientResourcesErr
	errCodeStreamOffline       natsjs.ErrorCode = 10118 // JSStreamOfflineErr
	errCodeConsumerOffline     natsjs.ErrorCode = 10119 // JSConsumerOfflineErr
)

// transientErrors are the NATS client's errors for a connection that
// cannot carry a request now, and its timeouts.
var transientErrors = []error{
	nats.ErrConnectionClosed,
	nats.ErrConnectionDraining,
	nats.ErrDrainTimeout,
	nats.ErrConnectionReconnecting,
	nats.ErrDisconnected,
	nats.ErrNoServers,
	nats.ErrReconnectBufExceeded,
	nats.ErrStaleConnection,
	nats.ErrTimeout,
	nats.ErrNoResponders,
	nats.ErrJetStreamNotEnabled,
	nats.ErrNoStreamResponse,
	natsjs.ErrJetStreamNotEnabled,
	natsjs.ErrNoStreamResponse,
	natsjs.ErrConnectionClosed,
	natsjs.ErrServerShutdown,
	context.DeadlineExceeded,
}

// IsTransient reports whether err, returned by a NATS or JetStream call, is
// a condition that passes: the connection is down, reconnecting, closed or
// draining, its reconnect buffer is full, the call timed out (a NATS
// timeout, or the deadline of the call's context), nothing answered, or
// JetStream answered that it cannot serve now (HTTP-like code 503, cluster
// or stream offline, insufficient resources). It is the one place where
// such NATS errors are classified; an error it already wrapped with
// ErrUnavailable is transient too.
//
// context.DeadlineExceeded counts because NATS calls report their timeouts
// with it; callers must not pass the error of a wait that ran out on
// purpose.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	for _, t := range transientErrors {
		if errors.Is(err, t) {
			return true
		}
	}
	var apiErr *natsjs.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errCodeClusterNotAvailable, errCodeInsufficientRes, errCodeStreamOffline, errCodeConsumerOffline:
			return true
		}
		return apiErr.Code == 503
	}
	return false
}

// Unavailable returns err wrapped so that it also matches ErrUnavailable
// when IsTransient(err), and err unchanged otherwise (nil stays nil). The
// cause stays matchable with errors.Is and errors.As.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || !IsTransient(err) {
		return err
	}
	return &unavailableError{err: err}
}

// unavailableError is a transient error marked as ErrUnavailable.
type unavailableError struct{ err error }

// Disconnected is how an error says that the connection was down when the
// call was made: what nats.ErrReconnectBufExceeded means on a jetflow
// connection.
const Disconnected = "disconnected from NATS (reconnecting)"

// Error reads "jetflow: NATS unavailable, retry later: <cause>". A write
// made while the connection is down fails with nats.ErrReconnectBufExceeded,
// whose text ("outbound buffer limit exceeded") blames a buffer: jetflow's
// connections have none (ConnOptions), so the connection being down is the
// whole cause, and the message says Disconnected instead. errors.Is still
// finds nats.ErrReconnectBufExceeded.
func (e *unavailableError) Error() string {
	cause := e.err.Error()
	if errors.Is(e.err, nats.ErrReconnectBufExceeded) {
		cause = strings.ReplaceAll(cause, nats.ErrReconnectBufExceeded.Error(), Disconnected)
	}
	return ErrUnavailable.Error() + ": " + cause
}

// Unwrap exposes both the marker and the cause.
func (e *unavailableError) Unwrap() []error { return []error{ErrUnavailable, e.err} }
