package jetflow

import (
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"github.com/jetflow/jetflow/internal/state"
	"github.com/jetflow/jetflow/internal/workflow"
	"github.com/jetflow/jetflow/jetflowtype"
)

// The codes of a wait's failures: StepError.Code, and StepRecord.Code of
// the wait's committed record.
const (
	// CodeEventTimeout: the wait's timeout passed before an event came
	// (ErrEventTimeout). A normal outcome of a wait with WithTimeout:
	// tools show it as "timed out", not as a fatal error.
	CodeEventTimeout = jetflowtype.CodeEventTimeout
	// CodeHookTaken: another wait had taken the wait's hook token
	// (ErrHookTaken).
	CodeHookTaken = jetflowtype.CodeHookTaken
)

// Errors of sleeps, waits and event deliveries.
var (
	// ErrEventTimeout is matched by the error of a wait whose timeout
	// passed before an event came (WithTimeout), from Get, AwaitAll and
	// AwaitFirst alike. It is a *StepError with Code "event_timeout".
	ErrEventTimeout = jetflowtype.ErrEventTimeout
	// ErrHookTaken is matched by the error of a wait whose hook token
	// another wait had taken (tokens are single-use). It is also a
	// *StepError with Code "hook_taken".
	ErrHookTaken = jetflowtype.ErrHookTaken
	// ErrUnknownEvent: the workflow declares no event of that name
	// (WithEvent), or declares it with another payload type. A sender gets
	// it too, and nothing is stored.
	ErrUnknownEvent = workflow.ErrUnknownEvent
	// ErrEventPayload: an event's payload is not JSON, or does not decode
	// into the event's declared type. Nothing is stored.
	ErrEventPayload = workflow.ErrEventPayload
	// ErrHookNotFound: no running run waits on the hook token. A token
	// becomes resumable once its run reaches the wait: a resume sent
	// before that (the run was just started, or its tasks are backed up)
	// gets this answer and may be sent again. Nothing is stored.
	ErrHookNotFound = workflow.ErrHookNotFound
	// ErrEventConflict: the event ID was delivered before with another
	// payload, or the hook's wait has already ended (with another event, or
	// its timeout). Nothing is changed.
	ErrEventConflict = workflow.ErrEventConflict
	// ErrInvalidEventID: an event ID that is empty, longer than 256 bytes
	// or holds a control character.
	ErrInvalidEventID = state.ErrInvalidEventID
	// ErrInvalidHookToken: a hook token that is not 1..128 characters of
	// [A-Za-z0-9_=-].
	ErrInvalidHookToken = state.ErrInvalidHookToken
)

// eventType is an event a workflow declares (WithEvent): its payload type,
// and the check that a payload decodes into it.
type eventType struct {
	typ   reflect.Type
	check func(json.RawMessage) error
}

// WithEvent declares that the workflow waits for the event called name,
// whose payload is a T. A wait for an undeclared event, or with another
// type, fails (ErrUnknownEvent); a sender of an undeclared event, or of a
// payload that does not decode into T, gets ErrUnknownEvent or
// ErrEventPayload and the run never sees it. name is 1..64 characters of
// [A-Za-z0-9_-] (checked when the workflow is registered).
func WithEvent[T any](name string) WorkflowOption {
	return func(o *workflowOptions) {
		if o.events == nil {
			o.events = make(map[string]eventType)
		}
		o.events[name] = eventType{typ: reflect.TypeFor[T](), check: func(raw json.RawMessage) error {
			var v T
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("%w: does not decode into %T: %w", ErrEventPayload, v, err)
			}
			return nil
		}}
	}
}

// WaitOption configures a wait for an event (WaitEvent, OnEvent).
type WaitOption func(*waitOptions)

type waitOptions struct {
	timeout time.Duration
	token   string
}

// WithTimeout ends the wait with ErrEventTimeout when no event has come
// within d of the wait's start. Without it a wait has no end but an event
// (or the run's cancellation).
func WithTimeout(d time.Duration) WaitOption { return func(o *waitOptions) { o.timeout = d } }

// WithHookToken makes the wait a hook: it is addressed by token
// (Client.Resume, POST /v1/hooks/{token}) instead of by run ID and event
// name, so an outside system resumes it without knowing the run ID. The
// token is 1..128 characters of [A-Za-z0-9_=-], chosen or derived by the
// workflow (order-42-approval), and single-use: it resumes this one wait,
// and a later wait with the same token fails with ErrHookTaken. It becomes
// resumable when the run reaches the wait; a resume before that is
// ErrHookNotFound.
func WithHookToken(token string) WaitOption { return func(o *waitOptions) { o.token = token } }

// WaitEvent waits for the event called name and returns its payload. It is
// OnEvent(...).Get(ctx).
func WaitEvent[T any](ctx *Context, name string, opts ...WaitOption) (T, error) {
	return OnEvent[T](ctx, name, opts...).Get(ctx)
}

// OnEvent starts a wait for the event called name without blocking and
// returns its future, for AwaitFirst against a timer or a step.
//
// The wait is a step of the run whose record holds the event: its step ID
// is <run>.event=<name>.<occurrence> (hook=<name> with WithHookToken), and
// it ends once, with the first of: an event delivered to it, or its
// timeout. Events sent to the run under name (Client.SendEvent) fill its
// waits in the order the body starts them: one that comes before the body
// reaches its wait is kept and delivered when it does, and one that comes
// after a wait timed out goes to the next wait for name. A wait the body
// no longer awaits (it lost an AwaitFirst) still takes the next event;
// to wait for one event across several timers, start the wait once and
// race that future against each timer.
//
// The event must be declared on the workflow with WithEvent[T](name).
// Get returns the payload, ErrEventTimeout (with a *StepError), or
// ErrHookTaken.
func OnEvent[T any](ctx *Context, name string, opts ...WaitOption) *Future[T] {
	var o waitOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := ctx.declared(name, reflect.TypeFor[T]()); err != nil {
		return &Future[T]{err: ctx.c.Misuse(err)}
	}
	spec := workflow.WaitSpec{Kind: state.StepEvent, Event: name, Timeout: o.timeout, Token: o.token}
	if o.token != "" {
		spec.Kind = state.StepHook
	}
	p, err := ctx.c.StartWait(name, spec)
	return &Future[T]{p: p, err: err}
}

// declared checks that the workflow declares the event name with payload
// type typ.
func (c *Context) declared(name string, typ reflect.Type) error {
	et, ok := c.events[name]
	switch {
	case !ok:
		return fmt.Errorf("%w: workflow %s does not declare event %q (WithEvent)", ErrUnknownEvent, c.WorkflowName(), name)
	case et.typ != typ:
		return fmt.Errorf("%w: workflow %s declares event %q as %s, waited for as %s", ErrUnknownEvent, c.WorkflowName(), name, et.typ, typ)
	}
	return nil
}

// Sleep pauses the run for d, durably: the run holds no worker, goroutine
// or timer while it sleeps. The wake-up is a message the NATS server
// stores and publishes when it is due, so it survives worker crashes and
// server restarts, and it wakes the run once, never before d has passed
// since the body first reached the sleep. The sleep is a step called name
// (its ID run.name.occurrence, like any step's): a replay after the wake
// returns at once. It is Timer(...).Get(ctx) without the time.
func Sleep(ctx *Context, name string, d time.Duration) error {
	_, err := Timer(ctx, name, d).Get(ctx)
	return err
}

// SleepUntil is Sleep until t; a t in the past returns at once.
func SleepUntil(ctx *Context, name string, t time.Time) error {
	_, err := TimerUntil(ctx, name, t).Get(ctx)
	return err
}

// Timer starts a durable sleep of d without blocking and returns its
// future, which completes with the sleep's deadline: race it against an
// event or a step with AwaitFirst. See Sleep.
func Timer(ctx *Context, name string, d time.Duration) *Future[time.Time] {
	p, err := ctx.c.StartWait(name, workflow.WaitSpec{Kind: state.StepSleep, For: d})
	return &Future[time.Time]{p: p, err: err}
}

// TimerUntil is Timer until t.
func TimerUntil(ctx *Context, name string, t time.Time) *Future[time.Time] {
	if t.IsZero() {
		return &Future[time.Time]{err: fmt.Errorf("%w: sleep %s until the zero time", ErrInvalidInput, name)}
	}
	p, err := ctx.c.StartWait(name, workflow.WaitSpec{Kind: state.StepSleep, Until: t})
	return &Future[time.Time]{p: p, err: err}
}
