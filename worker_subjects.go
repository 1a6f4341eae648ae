package jetflow

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// subjectGuardEvery is how often a worker checks that the task and timer
// streams still take this version's subjects (see guardSubjects).
const subjectGuardEvery = 10 * time.Second

// guardSubjects adds back, every interval until stop is called, the
// subjects of this version that the task and timer streams lost: a worker
// of the version before the lease executor provisions them with its own
// subjects when it starts, which would refuse every task this version
// publishes until one of its workers starts again. With both versions
// side by side during an upgrade, such a loss lasts one interval. It also
// takes off the age limit that a worker of the version before puts on
// the buckets of a run's records (jetstream.RunRecordBuckets), under which
// the server would expire the records of a run older than the retention.
func guardSubjects(assets *jetstream.Assets, every time.Duration, log zerolog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, g := range []struct {
				restore     func(context.Context) ([]string, error)
				field, what string
				failed      string
			}{
				{assets.RestoreSubjects, "subjects", "an earlier version's worker removed this version's subjects from the streams; added them back",
					"cannot check the streams' subjects; trying again"},
				{assets.RestoreBuckets, "buckets", "an earlier version's worker put an age limit on the buckets of runs' records; took it off",
					"cannot check the buckets' age limits; trying again"},
			} {
				cctx, ccancel := context.WithTimeout(ctx, every)
				changed, err := g.restore(cctx)
				ccancel()
				if len(changed) > 0 {
					log.Warn().Strs(g.field, changed).Msg(g.what)
				}
				if err != nil && ctx.Err() == nil {
					log.Debug().Err(err).Msg(g.failed)
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
