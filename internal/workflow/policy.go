package workflow

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy decides how often and how fast a failing step is retried.
type RetryPolicy struct {
	// MaxAttempts counts every attempt, the first included (default 5).
	// A delivery after a worker crash counts as an attempt.
	MaxAttempts int
	// InitialInterval is the delay before the second attempt (default 1s).
	InitialInterval time.Duration
	// MaxInterval caps the delay (default 1m).
	MaxInterval time.Duration
	// Multiplier grows the delay per attempt (default 2).
	Multiplier float64
}

// WithDefaults fills unset fields.
func (p RetryPolicy) WithDefaults() RetryPolicy {
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

// Validate names the first bad field.
func (p RetryPolicy) Validate() error {
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

// ErrInvalidPolicy is returned for a retry policy with a bad field.
var ErrInvalidPolicy = errors.New("jetflow: invalid retry policy")

// Backoff is the delay after failed attempt number attempt (1-based) before
// the next one: exponential, capped, with up to 20% jitter subtracted so that
// retries of many runs spread out.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.WithDefaults()
	d := float64(p.InitialInterval) * math.Pow(p.Multiplier, float64(max(attempt-1, 0)))
	if d > float64(p.MaxInterval) {
		d = float64(p.MaxInterval)
	}
	d -= d * 0.2 * rand.Float64()
	return time.Duration(d)
}
