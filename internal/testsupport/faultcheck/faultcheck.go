// Package faultcheck reads back everything a fault scenario left behind and
// says whether the engine kept its promise: every accepted start has exactly
// one run, every run reached a final state, every committed step's side
// effect happened, no side effect ran after its step was committed, and no
// committed result changed. The fault tests and the soak benchmark share it.
package faultcheck

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/state"
)

// Ledger is the producer's side: every start it made and what it was told.
type Ledger struct {
	mu       sync.Mutex
	created  map[string]int
	dups     map[string]int
	expected map[string]bool
	failed   int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{created: make(map[string]int), dups: make(map[string]int), expected: make(map[string]bool)}
}

// Expect records a run the engine itself starts (a child run), which no
// producer start names: Check reads it back like a started run, and it
// counts in no start tally.
func (l *Ledger) Expect(runID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expected[runID] = true
}

// Accepted records a start that returned without error; created is its
// outcome.
func (l *Ledger) Accepted(runID string, created bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if created {
		l.created[runID]++
	} else {
		l.dups[runID]++
	}
}

// Len is the number of accepted starts.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.created {
		n += c
	}
	for _, c := range l.dups {
		n += c
	}
	return n
}

// Failed records a start that returned an error (and may be retried).
func (l *Ledger) Failed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed++
}

// Tally is what a ledger recorded.
type Tally struct {
	Starts     int             // accepted starts
	Duplicates int             // accepted starts that said existing
	Failed     int             // starts that returned an error
	Doubled    int             // run IDs more than one start was told it created
	Problems   []string        // one per doubled run ID
	RunIDs     map[string]bool // every run ID an accepted start named, and every expected one
}

// Tally counts what l recorded so far.
func (l *Ledger) Tally() Tally {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := Tally{Failed: l.failed, RunIDs: make(map[string]bool)}
	for id, n := range l.created {
		t.RunIDs[id] = true
		t.Starts += n
		if n > 1 {
			t.Doubled++
			t.Problems = append(t.Problems, fmt.Sprintf("run %s: %d starts said created", id, n))
		}
	}
	for id, n := range l.dups {
		t.RunIDs[id] = true
		t.Starts += n
		t.Duplicates += n
	}
	for id := range l.expected {
		t.RunIDs[id] = true
	}
	return t
}

// Effects is the external system the steps call: it records every attempt
// of every step by step ID, as a payment provider would log requests by
// Idempotency-Key.
type Effects struct {
	mu       sync.Mutex
	attempts map[string][]effect
}

// effect is one logged attempt and when it reached the log.
type effect struct {
	attempt int
	at      time.Time
}

// NewEffects returns an empty effect log.
func NewEffects() *Effects { return &Effects{attempts: make(map[string][]effect)} }

// Record logs one attempt of stepID, now.
func (e *Effects) Record(stepID string, attempt int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.attempts[stepID] = append(e.attempts[stepID], effect{attempt, time.Now()})
}

// ServeHTTP records POST ?step=<id>&attempt=<n>, so that worker processes
// can report their side effects to the test process.
func (e *Effects) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a, err := strconv.Atoi(r.URL.Query().Get("attempt"))
	step := r.URL.Query().Get("step")
	if err != nil || step == "" {
		http.Error(w, "want ?step=<id>&attempt=<n>", http.StatusBadRequest)
		return
	}
	e.Record(step, a)
}

// Attempts returns the attempts logged for stepID.
func (e *Effects) Attempts(stepID string) []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]int, 0, len(e.attempts[stepID]))
	for _, ef := range e.attempts[stepID] {
		out = append(out, ef.attempt)
	}
	return out
}

// Len is how many attempts were logged, of all steps.
func (e *Effects) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, a := range e.attempts {
		n += len(a)
	}
	return n
}

func (e *Effects) effects(stepID string) []effect {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]effect(nil), e.attempts[stepID]...)
}

// Writes counts every write to the steps bucket while it watches, to show
// that no committed result is ever written twice.
type Writes struct {
	mu     sync.Mutex
	perKey map[string]int
	stop   func() error
}

// WatchWrites starts counting writes to the steps bucket. Call Stop before
// reading the counts.
func WatchWrites(ctx context.Context, steps *jetstream.KV) (*Writes, error) {
	w, err := steps.Raw().WatchAll(ctx, natsjs.UpdatesOnly())
	if err != nil {
		return nil, fmt.Errorf("faultcheck: watch steps: %w", err)
	}
	ws := &Writes{perKey: make(map[string]int), stop: w.Stop}
	go func() {
		for e := range w.Updates() {
			if e == nil || state.IsLeaseKey(e.Key()) {
				continue // a run's lease is rewritten by design
			}
			ws.mu.Lock()
			ws.perKey[e.Key()]++
			ws.mu.Unlock()
		}
	}()
	return ws, nil
}

// Stop ends the watch. A watch whose subscription the connection already
// dropped (a reconnect), or whose consumer the server no longer has (a
// server restart), has nothing left to stop.
func (w *Writes) Stop() error {
	if err := w.stop(); err != nil && !errors.Is(err, nats.ErrBadSubscription) && !errors.Is(err, nats.ErrConsumerNotFound) && !errors.Is(err, natsjs.ErrConsumerNotFound) {
		return err
	}
	return nil
}

func (w *Writes) rewritten() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var keys []string
	for k, n := range w.perKey {
		if n > 1 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// Verdict is what the checker saw.
type Verdict struct {
	Starts         int // accepted starts
	FailedStarts   int // starts that returned an error (retried or not)
	Duplicates     int // accepted starts that said existing
	Runs           int // run IDs the producer was told about
	Completed      int
	CommittedSteps int
	ChildSteps     int // committed steps that stand for a child run (no side effect of their own)
	WaitSteps      int // committed ends of sleeps and waits for events (no side effect of their own)
	SideEffects    int // attempts logged by the effect server
	Reruns         int // attempts other than the committed one that began before the commit (crashes, overlaps)
	Lost           int // accepted run without a run record, not final, or a committed step without its effect
	Doubled        int // a run created more than once, an effect after its step's commit, a result rewritten
	Problems       []string
}

// OK reports whether nothing was lost or doubled.
func (v Verdict) OK() bool { return v.Lost == 0 && v.Doubled == 0 && len(v.Problems) == 0 }

func (v Verdict) String() string {
	s := fmt.Sprintf("starts=%d (failed %d) duplicates=%d runs=%d completed=%d committed_steps=%d child_steps=%d wait_steps=%d side_effects=%d reruns=%d lost=%d doubled=%d",
		v.Starts, v.FailedStarts, v.Duplicates, v.Runs, v.Completed, v.CommittedSteps, v.ChildSteps, v.WaitSteps, v.SideEffects, v.Reruns, v.Lost, v.Doubled)
	return s + ProblemList(v.Problems)
}

// ProblemList is problems as indented lines under a verdict's summary, at
// most 10 of them and a count of the rest; "" when there are none.
func ProblemList(problems []string) string {
	if len(problems) == 0 {
		return ""
	}
	shown := problems
	if len(shown) > 10 {
		shown = append(shown[:10:10], fmt.Sprintf("... %d more", len(problems)-10))
	}
	return "\n  " + strings.Join(shown, "\n  ")
}

// Check waits until every run the ledger knows is final (or ctx ends) and
// then reads every run and step back. stepsPerRun is how many steps a
// completed run commits (a child step counts as one; its child run is
// checked only when the ledger expects it, with its own stepsPerRun in a
// Check of its own).
//
// ackWait is the workers' AckWait. It is the allowance between a commit
// and an effect of a later attempt: that attempt read the step as not yet
// committed before the commit landed, and reached the effect server up to a
// scheduling delay later. A worker delayed by more than AckWait counts as
// stalled, so an effect later than that after the commit is a committed
// step run again.
func Check(ctx context.Context, assets *jetstream.Assets, l *Ledger, e *Effects, w *Writes, stepsPerRun int, ackWait time.Duration) Verdict {
	t := l.Tally()
	v := Verdict{FailedStarts: t.Failed, Starts: t.Starts, Duplicates: t.Duplicates, Doubled: t.Doubled, Problems: t.Problems, Runs: len(t.RunIDs)}
	ids := t.RunIDs

	runs, err := waitFinal(ctx, assets, ids)
	if err != nil {
		v.Problems = append(v.Problems, err.Error())
	}
	steps, err := readAll(ctx, assets.Steps)
	if err != nil {
		v.Problems = append(v.Problems, "read steps: "+err.Error())
	}
	byRun := make(map[string][]state.Step)
	for _, b := range steps {
		s, err := state.DecodeStep(b)
		if err != nil {
			v.Problems = append(v.Problems, "undecodable step: "+err.Error())
			continue
		}
		byRun[s.RunID] = append(byRun[s.RunID], s)
	}
	for id := range ids {
		run, ok := runs[id]
		switch {
		case !ok:
			v.Lost++
			v.Problems = append(v.Problems, fmt.Sprintf("run %s: no run record", id))
			continue
		case !run.Status.Terminal():
			v.Lost++
			v.Problems = append(v.Problems, fmt.Sprintf("run %s: still %s", id, run.Status))
		case run.Status == state.StatusCompleted:
			v.Completed++
			if n := len(byRun[id]); n != stepsPerRun {
				v.Lost++
				v.Problems = append(v.Problems, fmt.Sprintf("run %s completed with %d committed steps, want %d", id, n, stepsPerRun))
			}
		default:
			v.Problems = append(v.Problems, fmt.Sprintf("run %s ended %s: %+v", id, run.Status, run.Error))
		}
		for _, s := range byRun[id] {
			v.CommittedSteps++
			if s.Child != "" {
				// Its effect is the child run, checked as a run of its
				// own when the ledger expects it.
				v.ChildSteps++
				continue
			}
			if s.Kind != "" {
				// A sleep's end, an event or a timeout: the record is
				// all there is (a rewrite shows in the writes).
				v.WaitSteps++
				continue
			}
			attempts := e.effects(s.StepID)
			v.SideEffects += len(attempts)
			ran := false
			for _, a := range attempts {
				switch {
				case a.attempt == s.Attempt:
					ran = true
				case a.attempt > s.Attempt && a.at.After(s.Committed.Add(ackWait)):
					// A later attempt that began after the commit was
					// written: the committed step ran again.
					v.Doubled++
					v.Problems = append(v.Problems, fmt.Sprintf("step %s ran at attempt %d, %s after its commit at attempt %d",
						s.StepID, a.attempt, a.at.Sub(s.Committed).Round(time.Millisecond), s.Attempt))
				default:
					// An attempt that crashed, or overlapped the one that
					// committed (a redelivery while it ran): at least once.
					v.Reruns++
				}
			}
			if !ran && s.Error == nil {
				v.Lost++
				v.Problems = append(v.Problems, fmt.Sprintf("step %s committed at attempt %d without its side effect (saw %v)", s.StepID, s.Attempt, e.Attempts(s.StepID)))
			}
		}
	}
	if w != nil {
		for _, k := range w.rewritten() {
			v.Doubled++
			v.Problems = append(v.Problems, "step result written more than once: "+k)
		}
	}
	sort.Strings(v.Problems)
	return v
}

// waitFinal reads the run records of ids until all are final or ctx ends,
// and returns the last reading. It reads the whole bucket while many runs
// are pending and only the pending ones when few are left.
func waitFinal(ctx context.Context, assets *jetstream.Assets, ids map[string]bool) (map[string]state.Run, error) {
	runs := make(map[string]state.Run, len(ids))
	pending := make(map[string]bool, len(ids))
	for id := range ids {
		pending[id] = true
	}
	for {
		if len(pending) > 1000 {
			all, err := readAll(ctx, assets.Runs)
			if err != nil {
				return runs, fmt.Errorf("read runs: %w", err)
			}
			for id := range pending {
				if b, ok := all[id]; ok {
					if err := note(runs, pending, id, b); err != nil {
						return runs, err
					}
				}
			}
		} else {
			for id := range pending {
				b, _, err := assets.Runs.Get(ctx, id)
				if errors.Is(err, jetstream.ErrNotFound) {
					continue
				}
				if err != nil {
					return runs, err
				}
				if err := note(runs, pending, id, b); err != nil {
					return runs, err
				}
			}
		}
		if len(pending) == 0 {
			return runs, nil
		}
		select {
		case <-ctx.Done():
			return runs, fmt.Errorf("%d of %d runs not final when the deadline passed", len(pending), len(ids))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// note records a run read back, and whether it is final.
func note(runs map[string]state.Run, pending map[string]bool, id string, b []byte) error {
	run, err := state.DecodeRun(b)
	if err != nil {
		return fmt.Errorf("run %s: %w", id, err)
	}
	runs[id] = run
	if run.Status.Terminal() {
		delete(pending, id)
	}
	return nil
}

// readAll returns the current value of every key in a bucket, read with one
// ordered consumer; in the steps bucket, leases are not steps and are left
// out.
func readAll(ctx context.Context, kv *jetstream.KV) (map[string][]byte, error) {
	w, err := kv.Raw().WatchAll(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	out := make(map[string][]byte)
	for {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return out, errors.New("watch closed")
			}
			if e == nil {
				return out, nil
			}
			if !state.IsLeaseKey(e.Key()) {
				out[e.Key()] = e.Value()
			}
		}
	}
}
