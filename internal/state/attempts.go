package state

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// AttemptLog is the record of a step's attempts in the attempts bucket,
// keyed by step ID: the highest attempt started, and the failed attempts
// that were retried (the last MaxAttemptFailures, oldest first). It is
// written only when a step runs more than once, so a step that succeeds at
// once costs nothing here. Records written before the log existed hold the
// started count alone, as a bare integer; DecodeAttemptLog reads both.
type AttemptLog struct {
	V        int              `json:"v"`
	Started  int              `json:"started"`
	Failures []AttemptFailure `json:"failures,omitempty"`
	// NotBefore is when the next attempt of a step its run's holder
	// retries after a long backoff may start (its retry timer is due
	// then); zero when no retry waits.
	NotBefore time.Time `json:"not_before,omitzero"`
}

// AttemptFailure is one failed attempt of a step that was retried.
type AttemptFailure struct {
	// StepID is the step that failed: the log's key names the task, and a
	// run's start task runs its first step itself.
	StepID    string    `json:"step_id,omitempty"`
	Attempt   int       `json:"attempt"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	Worker    string    `json:"worker,omitempty"`
	Error     string    `json:"error"`
}

// MaxAttemptFailures is how many failed attempts a log keeps;
// MaxAttemptErrorLen how much of each error message.
const (
	MaxAttemptFailures = 10
	MaxAttemptErrorLen = 1024
)

// Add records failure f, keeping the last MaxAttemptFailures (a repeat
// of an attempt already logged replaces it), and raises Started to its
// attempt.
func (l *AttemptLog) Add(f AttemptFailure) {
	if len(f.Error) > MaxAttemptErrorLen {
		f.Error = f.Error[:MaxAttemptErrorLen] + "…"
	}
	l.Started = max(l.Started, f.Attempt)
	for i := range l.Failures {
		if l.Failures[i].Attempt == f.Attempt {
			l.Failures[i] = f
			return
		}
	}
	l.Failures = append(l.Failures, f)
	if n := len(l.Failures); n > MaxAttemptFailures {
		l.Failures = l.Failures[n-MaxAttemptFailures:]
	}
}

// DecodeAttemptLog reads an attempts-bucket record: a log, or the bare
// started count written before logs existed.
func DecodeAttemptLog(b []byte) (AttemptLog, error) {
	if n, err := strconv.Atoi(string(b)); err == nil {
		if n < 0 {
			return AttemptLog{}, fmt.Errorf("%w: attempt record: negative count %d", ErrCorrupt, n)
		}
		return AttemptLog{V: Version, Started: n}, nil
	}
	var l AttemptLog
	if err := json.Unmarshal(b, &l); err != nil {
		return AttemptLog{}, fmt.Errorf("%w: attempt record: %w", ErrCorrupt, err)
	}
	if err := checkTimes("attempt record", l.NotBefore); err != nil {
		return AttemptLog{}, err
	}
	if l.Started < 0 || len(l.Failures) > MaxAttemptFailures {
		return AttemptLog{}, fmt.Errorf("%w: attempt record: started %d, %d failures", ErrCorrupt, l.Started, len(l.Failures))
	}
	return l, nil
}
