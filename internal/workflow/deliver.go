package workflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jetflow/jetflow/internal/dedupe"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/runs"
	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/jetflowtype"
)

// Errors of an event delivery (Sender). Each is what the sender is told;
// none of them stores anything.
var (
	// ErrRunNotFound: the run ID holds no run.
	ErrRunNotFound = jetflowtype.ErrRunNotFound
	// ErrHookNotFound: no run waits, or has waited, on the hook token.
	ErrHookNotFound = errors.New("jetflow: no run waits on this hook token")
	// ErrRunEnded: the run has ended; no wait of it will see the event.
	ErrRunEnded = errors.New("jetflow: run already ended")
	// ErrEventConflict: the event ID was delivered before with another
	// payload, or the hook's single wait has already ended with another
	// event or its timeout.
	ErrEventConflict = errors.New("jetflow: event conflicts with one delivered before")
	// ErrUnknownEvent: the run's workflow declares no event of that name.
	ErrUnknownEvent = errors.New("jetflow: the workflow declares no such event")
	// ErrEventPayload: the payload is not JSON, is too large, or does not
	// decode into the event's declared type.
	ErrEventPayload = errors.New("jetflow: invalid event payload")
)

// Event is one delivery of an event: to the wait for the event called
// Name in the run RunID, or to the wait on the hook Token (one of the
// two). ID identifies the event: a repeat with the same ID is a duplicate.
// TraceParent, the W3C trace context of the delivery, is stored with the
// event's record, for the span of the wait it ends to link to.
type Event struct {
	RunID       string
	Name        string
	Token       string
	ID          string
	Payload     json.RawMessage
	TraceParent string
}

// Validate checks the event's addressing, ID and payload (JSON, within
// state.MaxInputBytes).
func (ev Event) Validate() error {
	switch {
	case ev.Token != "" && (ev.RunID != "" || ev.Name != ""):
		return fmt.Errorf("%w: an event goes to a hook token or to a run and event name, not both", ErrInput)
	case ev.Token != "":
		if err := state.ValidateHookToken(ev.Token); err != nil {
			return err
		}
	default:
		if err := state.ValidateRunID(ev.RunID); err != nil {
			return err
		}
		if err := state.ValidateName(ev.Name); err != nil {
			return err
		}
	}
	if err := state.ValidateEventID(ev.ID); err != nil {
		return err
	}
	if len(ev.Payload) > state.MaxInputBytes {
		return fmt.Errorf("%w: %w: %d bytes, limit %d", ErrEventPayload, state.ErrInputTooLarge, len(ev.Payload), state.MaxInputBytes)
	}
	if !json.Valid(ev.Payload) {
		return fmt.Errorf("%w: not JSON", ErrEventPayload)
	}
	return nil
}

// Target is the wait an event goes to, as Sender.Resolve found it: the
// run (read at Rev), the event's name, and for a hook the waiting step.
type Target struct {
	Run    state.Run
	Rev    uint64
	Name   string
	StepID string // a hook's; empty for an event by run ID and name
}

// Delivery is what a delivered event did.
type Delivery struct {
	// Duplicate: the event ID was delivered before (with the same
	// payload); nothing changed.
	Duplicate bool
	RunID     string
	Workflow  string
	// StepID is the wait step that holds the event.
	StepID string
}

// Sender delivers events into runs. A delivery commits the event as the
// record of a wait step (create-if-absent) and wakes the run (Wake); the
// commit is the delivery, so a repeat finds it and changes nothing: it
// wakes the run only when the first delivery's wake may be missing (see
// Deliver).
//
// An event by run ID and name goes to the first wait for that name (in
// the order the body starts them) whose step holds no record: an event
// that comes before the body reaches its wait is kept there until it
// does, and one that comes after a wait timed out goes to the next wait.
// An event to a hook token goes to the token's one wait.
type Sender struct {
	Assets *jetstream.Assets
	Runs   *runs.Store
	Now    func() time.Time
}

// Resolve finds the run and wait ev goes to (the run may have ended:
// Deliver tells). An unknown run is ErrRunNotFound, an unknown token, or
// one whose run ID holds another run now, ErrHookNotFound.
func (s Sender) Resolve(ctx context.Context, ev Event) (Target, error) {
	var (
		t    Target
		hook state.Hook
	)
	runID, name := ev.RunID, ev.Name
	if ev.Token != "" {
		h, err := HookTokens{Assets: s.Assets}.Get(ctx, ev.Token)
		if err != nil {
			return t, err
		}
		hook, runID, name, t.StepID = h, h.RunID, h.Event, h.StepID
	}
	run, rev, err := s.Runs.Get(ctx, runID)
	switch {
	case errors.Is(err, runs.ErrNotFound) && ev.Token != "":
		return t, fmt.Errorf("%w: %s (its run %s is gone)", ErrHookNotFound, ev.Token, runID)
	case errors.Is(err, runs.ErrNotFound):
		return t, fmt.Errorf("%w: %s", ErrRunNotFound, runID)
	case errors.Is(err, state.ErrCorrupt):
		return t, fmt.Errorf("jetflow: stored run %s: %v", runID, err) // not the sender's malformed request
	case err != nil:
		return t, err
	case ev.Token != "" && (run.Token != hook.RunToken || run.Generation != hook.Generation):
		return t, fmt.Errorf("%w: %s (the run ID %s holds another run now)", ErrHookNotFound, ev.Token, runID)
	}
	t.Run, t.Rev, t.Name = run, rev, name
	return t, nil
}

// Deliver commits ev, whose target Resolve found and whose payload the
// caller has checked against the event's declared type, and wakes the
// run. A repeat of a delivered event (same ID and payload) is a Duplicate
// and changes nothing: it does not wake the run (G25), unless the run
// still needs the first delivery's wake — it is parked on an await the
// event decides, and no run task that would replay the body is stored:
// then the sender before died between its commit and its wake, and this
// one wakes the run (repairs). Only a repeat pays for that look (a read of
// the run's lease, and of its run task when the lease says so). A repeat
// is a Duplicate after the run has ended too. The same ID with another
// payload, or a hook whose wait already ended, is ErrEventConflict, and
// wakes nothing; any other event for a run that has ended is ErrRunEnded.
func (s Sender) Deliver(ctx context.Context, t Target, ev Event) (Delivery, error) {
	payload, err := dedupe.Canonical(ev.Payload)
	if err != nil {
		return Delivery{}, fmt.Errorf("%w: %w", ErrEventPayload, err)
	}
	d := Delivery{RunID: t.Run.RunID, Workflow: t.Run.Workflow}
	identity := state.RunIdentity(t.Run.RunID, t.Run.Generation)
	ended := t.Run.Status.Terminal()
	for occ := 0; ; occ++ {
		id := t.StepID
		if id == "" {
			id = state.StepID(identity, state.EventStepName(t.Name), occ)
		}
		rec := state.Step{
			V: state.Version, StepID: id, RunID: t.Run.RunID, Name: state.StepName(id), Attempt: 1,
			Output: payload, Committed: s.Now().UTC(), EventID: ev.ID, HookToken: ev.Token, Kind: state.StepEvent,
			TraceParent: ev.TraceParent,
		}
		if ev.Token != "" {
			rec.Kind = state.StepHook
		}
		stored, err := s.commit(ctx, rec, !ended)
		if err != nil {
			return d, err
		}
		switch {
		case stored == nil && ended:
			return d, fmt.Errorf("%w: run %s is %s", ErrRunEnded, t.Run.RunID, t.Run.Status)
		case stored == nil: // committed now
			d.StepID = id
			return d, s.resume(ctx, t, id)
		case stored.EventID == ev.ID && bytes.Equal(stored.Output, payload):
			d.StepID, d.Duplicate = id, true
			if ended {
				return d, nil
			}
			need, err := s.wakeMissing(ctx, t, id)
			if err != nil || !need {
				return d, err
			}
			return d, s.resume(ctx, t, id)
		case stored.EventID == ev.ID:
			return d, fmt.Errorf("%w: event %s was delivered to %s with another payload", ErrEventConflict, ev.ID, id)
		case t.StepID != "" && stored.EventID != "":
			return d, fmt.Errorf("%w: hook %s was resumed by event %s", ErrEventConflict, ev.Token, stored.EventID)
		case t.StepID != "":
			return d, fmt.Errorf("%w: the wait on hook %s has ended: %s", ErrEventConflict, ev.Token, stored.Error.Message)
		}
		// That wait holds another event, or timed out: try the next.
	}
}

// commit writes rec with create-if-absent (only reads, unless create)
// and returns nil, or the record already stored under its step ID.
func (s Sender) commit(ctx context.Context, rec state.Step, create bool) (*state.Step, error) {
	var (
		v   []byte
		err error
	)
	if create {
		if v, err = state.Encode(rec); err != nil {
			return nil, err
		}
		_, err = s.Assets.Steps.Create(ctx, rec.StepID, v)
		if err == nil {
			return nil, nil
		}
		if !errors.Is(err, jetstream.ErrExists) {
			return nil, fmt.Errorf("jetflow: deliver event to %s: %w", rec.StepID, err)
		}
		v, _, err = s.Assets.Steps.GetExisting(ctx, rec.StepID)
	} else {
		v, _, err = s.Assets.Steps.Get(ctx, rec.StepID)
		if errors.Is(err, jetstream.ErrNotFound) {
			return nil, nil
		}
	}
	if err != nil {
		return nil, err
	}
	stored, err := state.DecodeStep(v)
	if err != nil {
		return nil, fmt.Errorf("jetflow: stored step %s: %v", rec.StepID, err) // not the sender's malformed request
	}
	if stored.Error == nil && stored.EventID == "" {
		stored.Error = &state.ErrorInfo{Message: "it holds no event"}
	}
	return &stored, nil
}

// wakeMissing reports whether t's run may still need the wake of the
// first delivery of its step id, committed: the run is parked on an await
// that id's commit decides, and no run task stored on its subject will
// replay the body (none, or one that absorbs nothing: storedTaskReplays).
// Any other run needs no wake: a run not parked is held, or not yet held,
// and its holder reads the step when the body reaches it (a holder looks
// again once it has parked); a run parked elsewhere reads it when it gets
// there; a stored wake replays it. A run of an earlier version's executor
// is resumed as before (its workers keep no lease).
func (s Sender) wakeMissing(ctx context.Context, t Target, id string) (bool, error) {
	if t.Run.Exec != state.ExecLease {
		return true, nil
	}
	identity := state.RunIdentity(t.Run.RunID, t.Run.Generation)
	l, _, err := readLease(ctx, s.Assets.Steps, identity)
	if err != nil || l == nil || l.State != state.LeaseParked || !slices.Contains(l.Waits, id) {
		return false, err
	}
	decided, err := awaitDecided(ctx, s.Assets.Steps, *l, id)
	if err != nil || !decided {
		return false, err
	}
	replays, err := storedTaskReplays(ctx, s.Assets, *l, jetstream.RunSubject(t.Run.Workflow, identity))
	return !replays, err
}

// resume wakes t's run for its step id, now holding the event.
func (s Sender) resume(ctx context.Context, t Target, id string) error {
	_, err := Wake(ctx, s.Assets, t.Run, t.Rev, id, id+".wake")
	return err
}

// HookTokens is the hooks bucket: the wait each hook token resumes.
type HookTokens struct {
	Assets *jetstream.Assets
}

// Register records h unless its token already has a record, and returns
// the token's record: h, or the one stored first (a repeat call for the
// same wait gets its own record back). A record of an earlier run under
// h's run ID (another generation or creating token: that run has ended,
// as the caller, running under the ID now, has checked) is replaced by h
// with compare-and-set.
func (hs HookTokens) Register(ctx context.Context, h state.Hook) (state.Hook, error) {
	b, err := state.Encode(h)
	if err != nil {
		return state.Hook{}, err
	}
	_, err = hs.Assets.Hooks.Create(ctx, h.Token, b)
	for errors.Is(err, jetstream.ErrExists) || errors.Is(err, jetstream.ErrRevisionMismatch) {
		v, rev, gerr := hs.Assets.Hooks.GetExisting(ctx, h.Token)
		if gerr != nil {
			return state.Hook{}, gerr
		}
		owner, derr := state.DecodeHook(v)
		if derr != nil {
			return state.Hook{}, fmt.Errorf("jetflow: stored hook %s: %v", h.Token, derr)
		}
		earlier := owner.RunID == h.RunID && (owner.RunToken != h.RunToken || owner.Generation != h.Generation) &&
			owner.Generation <= h.Generation
		if !earlier {
			return owner, nil
		}
		_, err = hs.Assets.Hooks.Update(ctx, h.Token, b, rev)
	}
	return h, err
}

// Get returns the record of token, or ErrHookNotFound.
func (hs HookTokens) Get(ctx context.Context, token string) (state.Hook, error) {
	v, _, err := hs.Assets.Hooks.Get(ctx, token)
	if errors.Is(err, jetstream.ErrNotFound) {
		return state.Hook{}, fmt.Errorf("%w: %s", ErrHookNotFound, token)
	}
	if err != nil {
		return state.Hook{}, err
	}
	h, err := state.DecodeHook(v)
	if err != nil {
		return state.Hook{}, fmt.Errorf("jetflow: stored hook %s: %v", token, err) // not the sender's malformed request
	}
	return h, nil
}
