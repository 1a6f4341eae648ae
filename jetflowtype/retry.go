package jetflowtype

import (
	"errors"
	"time"
)

// ErrInvalidPolicy: a retry policy has a bad field.
var ErrInvalidPolicy = errors.New("jetflow: invalid retry policy")

// RetryPolicy decides how often and how fast a failing step is retried.
// Zero fields take the defaults: 5 attempts, 1s initial backoff doubling to
// at most 1m, with jitter.
type RetryPolicy struct {
	// MaxAttempts counts every attempt, the first included (default 5; 1 =
	// no retries). A delivery after a worker crash counts as an attempt.
	MaxAttempts int
	// InitialInterval is the delay before the second attempt (default 1s).
	InitialInterval time.Duration
	// MaxInterval caps the delay (default 1m).
	MaxInterval time.Duration
	// Multiplier grows the delay per attempt (default 2; at least 1).
	Multiplier float64
}
