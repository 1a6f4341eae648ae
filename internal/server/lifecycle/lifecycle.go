// Package lifecycle is the process lifecycle the jetflow commands share
// (the worker runtime of package workermain, producer serve): a context
// that ends on SIGINT or SIGTERM, after which a second signal kills the
// process, and an operations server (package opshttp) that runs in the
// background from before the work starts until after it has drained.
//
//	ctx, stop := lifecycle.SignalContext(context.Background())
//	defer stop()
//	ctx, fail := context.WithCancelCause(ctx)
//	ops := lifecycle.ServeOps(ctx, ln, handler, func(err error) { fail(err) })
//	... start the work, wait for <-ctx.Done(), drain it ...
//	err = errors.Join(drainErr, ops.Stop())
package lifecycle

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/jetflow/jetflow/internal/server/opshttp"
)

// SignalContext returns a context derived from parent that is done on the
// first SIGINT or SIGTERM. The signals are then handed back to the
// runtime, so that a second one kills the process at once. stop releases
// the signal handler early.
func SignalContext(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, stop = signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}

// Ops is an operations server running in the background (ServeOps).
type Ops struct {
	stop context.CancelFunc
	done chan error

	once sync.Once
	err  error
}

// ServeOps serves h on ln (opshttp.Serve) in the background until Stop.
// With a nil ln it serves nothing and Stop returns nil.
//
// The server does not end with ctx: the work it reports on drains after
// ctx is done, and the server keeps answering (not ready, last metrics)
// until Stop, which the caller calls once the drain is over. If serving
// fails before Stop, failed (if not nil) is called with the error, from
// the server's goroutine, so that the caller stops the work too; Stop
// returns the same error.
func ServeOps(ctx context.Context, ln net.Listener, h http.Handler, failed func(error)) *Ops {
	opsCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	o := &Ops{stop: stop, done: make(chan error, 1)}
	if ln == nil {
		o.done <- nil
		return o
	}
	go func() {
		err := opshttp.Serve(opsCtx, ln, h)
		if err != nil && failed != nil {
			failed(err)
		}
		o.done <- err
	}()
	return o
}

// Stop shuts the server down gracefully (opshttp.ShutdownTimeout) and
// returns its error, nil when it served until Stop. Later calls return the
// same without waiting.
func (o *Ops) Stop() error {
	o.once.Do(func() {
		o.stop()
		o.err = <-o.done
	})
	return o.err
}
