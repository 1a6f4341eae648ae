package state

import (
	"fmt"
	"time"
)

// Expiry is a batch of ended run generations whose records are due to be
// removed: their steps and lease, their attempt and wait records, and the
// hook tokens they waited on. A worker that sees runs end (the sweeper's
// read of the run records) stores it as a timer due at the latest end
// plus retention among them; the worker that takes the due timer removes
// the records (internal/workflow, Expire).
type Expiry struct {
	V    int        `json:"v"`
	Runs []EndedRun `json:"runs"`
	// Due is when the batch is due: its runs' records are removed then.
	Due time.Time `json:"due"`
}

// EndedRun names one ended run generation: its run ID and generation
// (RunIdentity) and the token of the start that created it, which tells
// it from a later run of the same identity (a first generation started
// again once its run ID's expiry marker expired too). An empty token is
// not known (the run's record had expired when its end was read): any
// token's run of the identity is that run, unless its record is there.
type EndedRun struct {
	RunID      string `json:"run_id"`
	Generation int    `json:"generation,omitempty"`
	Token      string `json:"token,omitempty"`
}

// Identity is the run generation's identity: the prefix of its records'
// keys.
func (r EndedRun) Identity() string { return RunIdentity(r.RunID, r.Generation) }

// DecodeExpiry decodes and validates an expiry batch.
func DecodeExpiry(b []byte) (Expiry, error) {
	var e Expiry
	if err := decode(b, &e); err != nil {
		return Expiry{}, fmt.Errorf("expiry: %w", err)
	}
	if err := checkTimes("expiry", e.Due); err != nil {
		return Expiry{}, err
	}
	for _, r := range e.Runs {
		if err := ValidateRunID(r.RunID); err != nil {
			return Expiry{}, fmt.Errorf("%w: expiry: %w", ErrCorrupt, err)
		}
		if r.Generation < 0 {
			return Expiry{}, fmt.Errorf("%w: expiry: run %s: generation %d", ErrCorrupt, r.RunID, r.Generation)
		}
	}
	return e, nil
}
