package workflow

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strconv"

	goidlib "github.com/petermattis/goid"
)

// Mistakes in a workflow body that the engine refuses where it first can
// know them: at the call (a step started from a goroutine of the body's
// own), at the body's return (steps started and never awaited), and in a
// replay check (every call the body made that was refused: Misused).

// ErrWrongGoroutine: a step, wait, child or await called from a goroutine
// the body started: the body's calls are its history, in the order the
// body makes them, so they must come from the body's own goroutine. Start
// steps side by side with Go instead.
var ErrWrongGoroutine = errors.New("jetflow: called from a goroutine other than the workflow body's (use Go for steps side by side)")

// ErrUnawaited: the body returned while steps it started were never
// awaited; they were never run. Await them (Get, AwaitAll) before the body
// returns. The run fails with it.
var ErrUnawaited = errors.New("jetflow: the body returned before awaiting steps it started; they were not run")

// CodeUnawaited is the code of a run that failed with ErrUnawaited
// (RunError.Code).
const CodeUnawaited = "unawaited_steps"

// goid is the ID of the calling goroutine. Every call of a workflow body
// checks it (onBody), so it must be cheap: it is the runtime's own field,
// read by github.com/petermattis/goid in nanoseconds, unless that read
// disagrees at start-up with the ID in the goroutine's stack header (a
// runtime whose layout the library does not know): then the stack header's
// (stackGoid), a microsecond or more on a deep stack.
var goid, goidFast = pickGoid()

// pickGoid returns the fast read of the goroutine ID (and true) if it
// agrees with the stack header on this goroutine and on another one, else
// stackGoid.
func pickGoid() (func() uint64, bool) {
	fast := func() uint64 { return uint64(goidlib.Get()) }
	other := make(chan bool)
	go func() { other <- fast() == stackGoid() }()
	if fast() != stackGoid() || !<-other {
		return stackGoid, false
	}
	return fast, true
}

// stackGoid is the ID of the calling goroutine read off its stack header
// ("goroutine 123 [running]:").
func stackGoid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	n, _ := strconv.ParseUint(string(b), 10, 64)
	return n
}

// onBody returns ErrWrongGoroutine when the caller is not the body's
// goroutine (recorded by spawn), and records it for a replay check.
func (c *Context) onBody() error {
	if c.goid == 0 || goid() == c.goid {
		return nil
	}
	return c.Misuse(ErrWrongGoroutine)
}

// Misuse records err, a call of the body that was refused (a wait for an
// undeclared event, a step from another goroutine), for a replay check
// (CheckResult.Misused), and returns it.
func (c *Context) Misuse(err error) error {
	if c.mode == modeCheck {
		c.check.mu.Lock()
		c.check.misused = append(c.check.misused, err)
		c.check.mu.Unlock()
	}
	return err
}

// unawaited is the failure of a body that returned with steps it started
// after its last await, which no await classified, began or ran; nil when
// there are none.
func (c *Context) unawaited() error {
	if len(c.open) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrUnawaited, stepIDs(c.open))
}
