package workflow

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jetflow/jetflow/jetflowtype"
)

// RetryPolicy decides how often and how fast a failing step is retried:
// jetflowtype.RetryPolicy (the root package's RetryPolicy), named here for
// the engine.
type RetryPolicy = jetflowtype.RetryPolicy

// RetryWithDefaults is p with its unset fields filled.
func RetryWithDefaults(p RetryPolicy) RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 5
	}
	if p.InitialInterval == 0 {
		p.InitialInterval = time.Second
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = time.Minute
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	return p
}

// ValidateRetry names the first bad field of p.
func ValidateRetry(p RetryPolicy) error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("%w: MaxAttempts %d < 0", ErrInvalidPolicy, p.MaxAttempts)
	case p.InitialInterval < 0:
		return fmt.Errorf("%w: InitialInterval %s < 0", ErrInvalidPolicy, p.InitialInterval)
	case p.MaxInterval < 0:
		return fmt.Errorf("%w: MaxInterval %s < 0", ErrInvalidPolicy, p.MaxInterval)
	case p.Multiplier != 0 && p.Multiplier < 1:
		return fmt.Errorf("%w: Multiplier %g < 1", ErrInvalidPolicy, p.Multiplier)
	}
	return nil
}

// ErrInvalidPolicy is returned for a retry policy with a bad field
// (jetflowtype's).
var ErrInvalidPolicy = jetflowtype.ErrInvalidPolicy

// Backoff is the delay after failed attempt number attempt (1-based) before
// the next one: exponential, capped, with up to 20% jitter subtracted so that
// retries of many runs spread out.
func Backoff(p RetryPolicy, attempt int) time.Duration {
	p = RetryWithDefaults(p)
	d := float64(p.InitialInterval) * math.Pow(p.Multiplier, float64(max(attempt-1, 0)))
	if d > float64(p.MaxInterval) {
		d = float64(p.MaxInterval)
	}
	d -= d * 0.2 * rand.Float64()
	return time.Duration(d)
}
