package state

import (
	"fmt"
	"strings"
	"time"
)

// Lease is the record of who executes a run generation's body, stored in
// the steps bucket under LeaseKey(identity), beside the run's step records
// (a batch read of the run's keys returns it with them). Its revision is
// the fence of the run: a holder writes every step result it commits with
// "the lease's last revision is the one I hold", so a holder whose lease
// was taken over, or whose run was cancelled, can commit nothing more.
//
// A run's first holder (the first delivery of its start task) holds the
// lease without a record: its fence is "no lease record". The record is
// written when a holder renews its lease (a task running longer than a
// third of its ack wait), parks the run (a wait), hands it back (a
// release), takes it over from an earlier holder, or when the run is
// cancelled.
type Lease struct {
	V     int        `json:"v"`
	State LeaseState `json:"state"`
	// Worker, Seq and Delivered name the delivery that wrote the record:
	// the worker, and the run task's stream sequence and delivery count.
	Worker    string `json:"worker,omitempty"`
	Seq       uint64 `json:"seq,omitempty"`
	Delivered int    `json:"delivered,omitempty"`
	// Epoch is the number of the await the body was parked at (counting
	// from 1): every await up to it has dispatched its branches, stored its
	// timers and admitted its children.
	Epoch int `json:"epoch,omitempty"`
	// Waits are the steps the parked body waits for: every one of them
	// when All (an AwaitAll), else any of them.
	Waits []string `json:"waits,omitempty"`
	All   bool     `json:"all,omitempty"`
	// Places are the places of Waits in the order the body started
	// steps (state.Step.Seq), one per wait: a later holder compares its
	// body's calls at those places with them, as with committed records.
	// Began: the steps in Waits are what the await began (branches,
	// waits, children), not a sequential step whose retry waits for its
	// timer. Records written before they existed have neither.
	Places []int `json:"places,omitempty"`
	Began  bool  `json:"began,omitempty"`
	// Begun and BegunPlaces are the other steps the body had begun as
	// branches, waits or children when it parked, not committed then, and
	// not in Waits (a Go not awaited yet): a later holder's body must
	// start them again at those places, and not run them in place.
	Begun       []string `json:"begun,omitempty"`
	BegunPlaces []int    `json:"begun_places,omitempty"`
	// Passed is the number of awaits of the body that holders of the run
	// have passed (returned from), as far as the writers of the lease
	// knew: a holder that passes a later await is the first to, which is
	// how a wait's span is emitted once (docs/tracing.md). Records
	// written before it existed hold 0; a parked one's Epoch tells (see
	// PassedAwaits).
	Passed int `json:"passed,omitempty"`
	// Unstarted marks a record written by a delivery that handed its run
	// task back without starting anything (its worker was stopping): the
	// next delivery of the task takes the run as that one found it —
	// Clean (parked, or fresh) and Inherited (the holder before may have
	// been running a step) say how, with Epoch.
	Unstarted bool      `json:"unstarted,omitempty"`
	Clean     bool      `json:"clean,omitempty"`
	Inherited bool      `json:"inherited,omitempty"`
	At        time.Time `json:"at"`
}

// LeaseState is what a lease record says of the run's body.
type LeaseState string

const (
	// LeaseHeld: a delivery executes the body and renews the record.
	LeaseHeld LeaseState = "held"
	// LeaseParked: the body waits (a sleep, an event, a child, branches);
	// the run task that parked it was acknowledged, and the next one takes
	// the lease at once.
	LeaseParked LeaseState = "parked"
	// LeaseReleased: the holder handed its run task back unfinished
	// (shutdown, a NATS failure); its redelivery takes the lease at once.
	LeaseReleased LeaseState = "released"
	// LeaseCancelled: the run was cancelled. Final: no holder takes the
	// lease again, and the commit of a holder that held it is refused.
	LeaseCancelled LeaseState = "cancelled"
)

// PassedAwaits is the number of awaits the record says the body has
// passed: Passed, and at least every await before the one a parked body
// waits at.
func (l Lease) PassedAwaits() int {
	if l.State == LeaseParked {
		return max(l.Passed, l.Epoch-1)
	}
	return l.Passed
}

// LeaseKey is the steps-bucket key of the lease of run generation identity
// (RunIdentity): two tokens, where a step ID has three, so that it never
// names a step.
func LeaseKey(identity string) string { return identity + ".lease" }

// IsLeaseKey reports whether a steps-bucket key is a lease's.
func IsLeaseKey(key string) bool {
	return strings.HasSuffix(key, ".lease") && strings.Count(key, ".") == 1
}

// DecodeLease decodes and validates a lease record.
func DecodeLease(b []byte) (Lease, error) {
	var l Lease
	if err := decode(b, &l); err != nil {
		return Lease{}, err
	}
	switch l.State {
	case LeaseHeld, LeaseParked, LeaseReleased, LeaseCancelled:
	default:
		return Lease{}, fmt.Errorf("%w: lease record: unknown state %q", ErrCorrupt, l.State)
	}
	if l.Delivered < 0 || l.Epoch < 0 || l.Passed < 0 {
		return Lease{}, fmt.Errorf("%w: lease record: negative delivery count, epoch or passed awaits", ErrCorrupt)
	}
	if err := checkTimes("lease record", l.At); err != nil {
		return Lease{}, err
	}
	return l, nil
}
