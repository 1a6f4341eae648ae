package jetflow

import (
	"context"
	"fmt"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/roster"
)

// EngineStatus is what an upgrade of the engine waits for
// (docs/operations.md, "Upgrading the engine"): the engine protocols of the
// workers running now, and the runs of the executor before the lease
// (protocol 1) that workers of this version have not taken over yet.
type EngineStatus struct {
	// Protocol is this version's engine protocol (EngineProtocol).
	Protocol int `json:"protocol"`
	// Workers counts the live workers by engine protocol ("0": a version
	// before protocols were recorded).
	Workers map[string]int `json:"workers"`
	// Foreign are the live workers of another protocol than this
	// version's: while one is, no worker of this version executes anything.
	Foreign []ForeignWorker `json:"foreign"`
	// LegacyRuns counts the runs admitted by protocol 1 that have not
	// ended and that no worker of this version has taken over yet (each is
	// taken over when its next message of protocol 1 is delivered: a run
	// asleep when its timer comes due), LegacyMessages the tasks and
	// timers of protocol 1 still stored; Undecodable the run records this
	// version could not read.
	LegacyRuns     int    `json:"legacy_runs"`
	LegacyMessages uint64 `json:"legacy_messages"`
	Undecodable    int    `json:"undecodable_records"`
	// Builds counts the runs of this version that have not ended (running
	// or blocked) by workflow and the build that started them (Run.Build;
	// "" while none is recorded): the runs each build holds, which a
	// pinned workflow's workers of that build must stay up for.
	Builds map[string]map[string]int `json:"builds"`
}

// OldWorkDone reports whether every run of protocol 1 has been taken over
// and none of its messages is left. It need not be true for an upgrade to
// be done: no run of an earlier protocol needs a worker of its version
// once one of this version serves (Ready), only its next message.
func (s EngineStatus) OldWorkDone() bool { return s.LegacyRuns == 0 && s.LegacyMessages == 0 }

// Ready reports whether workers of this version may execute: no live worker
// of another protocol.
func (s EngineStatus) Ready() bool { return len(s.Foreign) == 0 }

// EngineStatus reads the deployment's engine status: the roster's
// liveness records, the protocol-1 subjects of the task and timer streams,
// and every kept run record (one pass; seconds for a million runs), whose
// runs under way it counts by build.
func (c *Client) EngineStatus(ctx context.Context) (_ EngineStatus, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	out := EngineStatus{Protocol: EngineProtocol, Workers: map[string]int{}, Foreign: []ForeignWorker{}}
	live, err := roster.Current(ctx, c.assets.Workflows, time.Now())
	if err != nil {
		return out, err
	}
	seen := map[string]bool{}
	for _, l := range live {
		if seen[l.ID] {
			continue
		}
		seen[l.ID] = true
		out.Workers[fmt.Sprint(l.Protocol)]++
		if l.Protocol != EngineProtocol {
			out.Foreign = append(out.Foreign, ForeignWorker{Name: l.Worker, Protocol: l.Protocol, Build: l.Build, Beat: l.Beat})
		}
	}
	tasks, err := jetstream.CountMessages(ctx, c.assets.Tasks, jetstream.LegacyTaskSubjects)
	if err != nil {
		return out, err
	}
	timers, err := jetstream.CountMessages(ctx, c.assets.Timers, jetstream.LegacyTimerSubjects...)
	if err != nil {
		return out, err
	}
	out.LegacyMessages = tasks + timers
	census, err := c.runs.Census(ctx)
	out.LegacyRuns, out.Undecodable, out.Builds = census.Legacy, census.Undecodable, census.ByBuild
	return out, err
}
