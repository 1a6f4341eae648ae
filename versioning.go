package jetflow

import (
	"errors"
	"fmt"

	"github.com/jetflow/jetflow/internal/state"
)

// Versioning says how a workflow's runs in flight meet a deploy of new
// code (docs/changing-workflows.md).
type Versioning int

const (
	// UpgradeOnReplay (the default): a run goes on under whichever build's
	// worker takes it next. Its history is the check: code that departs
	// from it where it holds steps blocks the run before anything runs
	// there (StatusBlocked), and changes that must take another way for
	// runs under way are written with Patched.
	UpgradeOnReplay Versioning = iota
	// Pinned: a run is executed only by workers of the build that started
	// it (WorkerConfig.Build; Run.Build), however many builds serve the
	// workflow: keep workers of an old build running until its runs have
	// ended (Roster shows the runs each build holds). A task of a pinned
	// run that a worker of another build receives is handed back
	// untouched. A worker with no build identity cannot serve a pinned
	// workflow (ErrInvalidBuild).
	Pinned
)

func (v Versioning) String() string {
	switch v {
	case UpgradeOnReplay:
		return "upgrade-on-replay"
	case Pinned:
		return "pinned"
	}
	return fmt.Sprintf("Versioning(%d)", int(v))
}

// ErrInvalidVersioning: a workflow's versioning options are wrong: an
// unknown Versioning, a patch ID that is not a valid name, or declared
// twice.
var ErrInvalidVersioning = errors.New("jetflow: invalid workflow versioning")

// ErrInvalidBuild: a worker's build identity (WorkerConfig.Build) is not
// 1..64 characters of [A-Za-z0-9._+-], or is missing for a pinned workflow.
var ErrInvalidBuild = state.ErrInvalidBuild

// WithVersioning sets how the workflow's runs in flight meet new code
// (default UpgradeOnReplay).
func WithVersioning(v Versioning) WorkflowOption {
	return func(o *workflowOptions) { o.versioning = v }
}

// WithPatch declares the patch IDs the workflow's body asks about with
// Patched (each 1..64 characters of [A-Za-z0-9_-], each declared once): a
// Patched call with an undeclared ID fails the run, and a repeated or
// invalid one fails the workflow's registration.
func WithPatch(ids ...string) WorkflowOption {
	return func(o *workflowOptions) { o.patches = append(o.patches, ids...) }
}

// Patched reports whether the run takes the way of the code that has the
// patch id at this point of the body: true for every run that reaches it
// under code that asks, false for a run that went past it under code that
// did not (its history holds steps at or after this place). The first
// answer is committed with the run, so every replay, on any worker, gives
// the same one:
//
//	if jetflow.Patched(ctx, "welcome-email-v2") {
//		_, err = jetflow.Step(ctx, "send-welcome-email", sendWelcomeV2)
//	} else {
//		_, err = jetflow.Step(ctx, "send-welcome", sendWelcome)
//	}
//
// Declare id with WithPatch. Once no run that went past the point without
// the patch is in flight, the call and the old way can go (keep the new
// way): the markers it left are ignored by code that does not ask.
func Patched(ctx *Context, id string) bool { return ctx.c.Patched(id) }

// validateVersioning checks a workflow's versioning options.
func validateVersioning(v Versioning, patches []string) error {
	if v != UpgradeOnReplay && v != Pinned {
		return fmt.Errorf("%w: %s", ErrInvalidVersioning, v)
	}
	seen := make(map[string]bool, len(patches))
	for _, id := range patches {
		if err := state.ValidateName(id); err != nil {
			return fmt.Errorf("%w: patch: %w", ErrInvalidVersioning, err)
		}
		if seen[id] {
			return fmt.Errorf("%w: patch %q declared twice", ErrInvalidVersioning, id)
		}
		seen[id] = true
	}
	return nil
}
