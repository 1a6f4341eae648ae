package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jetflow/jetflow/internal/workflow"
)

// Future is a step or a child run that a workflow started without waiting
// for it (Go, Child). Get waits for its result; AwaitAll and AwaitFirst
// wait for several.
//
// Waiting does not hold a worker: when what the body waits for is not
// committed yet, the body stops, its task is acknowledged, and the body is
// replayed from the top (committed steps return their stored results) by
// the task that commits the last of what it waits for.
type Future[T any] struct {
	p   *workflow.Pending
	err error // an invalid call, reported by Get
}

// Awaitable is any *Future, for AwaitAll and AwaitFirst.
type Awaitable interface {
	pending() (*workflow.Pending, error)
}

func (f *Future[T]) pending() (*workflow.Pending, error) {
	if f == nil {
		return nil, fmt.Errorf("%w: nil future", ErrForeignFuture)
	}
	return f.p, f.err
}

// StepID is the deterministic ID of the step the future stands for; empty
// when the call that made it was invalid.
func (f *Future[T]) StepID() string {
	if f.p == nil {
		return ""
	}
	return f.p.StepID()
}

// Get waits for the future's step and returns its committed result, as
// Step does: its output, or its final failure as a *StepError (for a
// child, its failure or cancellation, with ChildRunID and ChildStatus set).
// Every call returns the same. ctx must be the Context of the run that
// started the future (ErrForeignFuture otherwise).
func (f *Future[T]) Get(ctx *Context) (T, error) {
	var zero T
	p, err := f.pending()
	if err != nil {
		return zero, err
	}
	raw, err := ctx.c.Result(p)
	if err != nil {
		return zero, publicStepErr(err)
	}
	return decodeResult[T](p.Name(), raw)
}

// decodeResult decodes the committed result raw of the step called name.
func decodeResult[T any](name string, raw json.RawMessage) (T, error) {
	var out T
	if err := json.Unmarshal(raw, &out); err != nil {
		var zero T
		return zero, fmt.Errorf("jetflow: step %s: committed result does not decode into %T: %w", name, out, err)
	}
	return out, nil
}

// Go starts the step called name without waiting for it and returns its
// future. Everything Step promises holds for it: the step's ID is
// run.name.occurrence, counted in the order the body starts steps (Step
// and Go share the count, whichever finishes first), fn runs at least once
// until its result is committed and never after, and its failure is
// retried by the step's policy.
//
// Steps started with Go run at the same time, each as its own task on any
// worker. A future the body never awaits (Get, AwaitAll, AwaitFirst)
// before it returns is abandoned with the run. Errors in the call itself
// (an invalid name or option) are returned by Get.
func Go[T any](ctx *Context, name string, fn func(ctx context.Context) (T, error), opts ...StepOption) *Future[T] {
	o, err := stepOpts(name, opts)
	if err != nil {
		return &Future[T]{err: err}
	}
	p, err := ctx.c.Start(name, o.policy, o.taskKey, encodeStep(name, fn))
	return &Future[T]{p: p, err: err}
}

// stepOpts applies opts; an invalid one is the call's error.
func stepOpts(name string, opts []StepOption) (stepOptions, error) {
	var o stepOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.err != nil {
		return o, fmt.Errorf("jetflow: step %s: %w", name, o.err)
	}
	return o, nil
}

// encodeStep turns a typed step function into the engine's, which returns
// JSON.
func encodeStep[T any](name string, fn func(ctx context.Context) (T, error)) workflow.StepFunc {
	return func(sctx context.Context) (json.RawMessage, error) {
		v, err := fn(sctx)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, Fatal(fmt.Errorf("encode result of step %s: %w", name, err))
		}
		return b, nil
	}
}

// AwaitAll waits until every one of fs is committed. It returns nil when
// all succeeded, and otherwise the first failure in the order of fs (each
// future's own result is read with Get, which then returns at once).
func AwaitAll(ctx *Context, fs ...Awaitable) error {
	ps, err := pendings(fs)
	if err != nil {
		return err
	}
	if _, err := ctx.c.Await(ps, false); err != nil {
		return err
	}
	for _, p := range ps {
		if _, err := p.Outcome(); err != nil {
			return publicStepErr(err)
		}
	}
	return nil
}

// AwaitFirst waits until one of fs is committed and returns its index in
// fs, with its failure if it failed. The first is the one whose result was
// committed first, the same on every replay. The others go on running;
// await them later, or they are abandoned when the body returns.
func AwaitFirst(ctx *Context, fs ...Awaitable) (int, error) {
	ps, err := pendings(fs)
	if err != nil {
		return -1, err
	}
	if len(ps) == 0 {
		return -1, fmt.Errorf("%w: AwaitFirst of no futures", ErrForeignFuture)
	}
	won, err := ctx.c.Await(ps, true)
	if err != nil {
		return -1, err
	}
	if _, err := ps[won].Outcome(); err != nil {
		return won, publicStepErr(err)
	}
	return won, nil
}

func pendings(fs []Awaitable) ([]*workflow.Pending, error) {
	ps := make([]*workflow.Pending, len(fs))
	for i, f := range fs {
		if f == nil {
			return nil, fmt.Errorf("%w: nil future", ErrForeignFuture)
		}
		p, err := f.pending()
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	return ps, nil
}

// publicStepErr is the *StepError in err's chain itself, when it has one:
// a step's failure reaches the workflow as a bare *StepError.
func publicStepErr(err error) error {
	var se *StepError
	if errors.As(err, &se) {
		return se
	}
	return err
}

// ChildOption configures a child run (Child).
type ChildOption func(*childOptions)

type childOptions struct {
	runID    string
	detached bool
}

// WithChildRunID names the child run instead of deriving its ID. The ID
// must be unique to this call: a run under it that is not this call's
// child makes the child fail to start (a *StepError without ChildStatus).
func WithChildRunID(id string) ChildOption { return func(o *childOptions) { o.runID = id } }

// Detached starts a child that is not cancelled with its parent. Its
// result still reaches the parent.
func Detached() ChildOption { return func(o *childOptions) { o.detached = true } }

// Child starts a run of wf with input as a child of this run, without
// waiting for it, and returns the future of its output.
//
// The child is a step of its parent, called by wf's name, so its step ID
// is run.name.occurrence like any step's, and its run ID is derived from
// that step (<run-id>=<name>=<occurrence>) unless WithChildRunID names
// one: a parent replayed or re-executed after a crash attaches to the same
// child, and the child is started exactly once. The child is a full run
// (GetRun, ListRuns and the CLI show it, with a link to its parent and the
// parent's to its children) and is cancelled with its parent unless
// Detached.
//
// Get returns the child's output, or its failure or cancellation as a
// *StepError with ChildRunID and ChildStatus. A workflow no worker of the
// deployment has registered, or a run ID that holds another run, is such
// an error too (ChildStatus empty). An invalid input or run ID is returned
// by Get without starting anything.
func Child[P, R any](ctx *Context, wf *Workflow[P, R], input P, opts ...ChildOption) *Future[R] {
	var o childOptions
	for _, opt := range opts {
		opt(&o)
	}
	in, err := json.Marshal(input)
	if err != nil {
		return &Future[R]{err: fmt.Errorf("%w: child %s: %w", ErrInvalidInput, wf.Name(), err)}
	}
	p, err := ctx.c.StartChild(wf.Name(), workflow.ChildSpec{Workflow: wf.Name(), Input: in, RunID: o.runID, Detached: o.detached})
	return &Future[R]{p: p, err: err}
}

// GetAll waits for every one of fs, as AwaitAll does, and returns their
// results in the order of fs, or the first failure in that order.
func GetAll[T any](ctx *Context, fs []*Future[T]) ([]T, error) {
	aw := make([]Awaitable, len(fs))
	for i, f := range fs {
		aw[i] = f
	}
	if err := AwaitAll(ctx, aw...); err != nil {
		return nil, err
	}
	out := make([]T, len(fs))
	for i, f := range fs {
		v, err := f.Get(ctx)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}
