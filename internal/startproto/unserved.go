package startproto

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/metrics"
)

// Unserved is a workflow with durable start envelopes waiting in
// JETFLOW_STARTS and no start consumer (jetflow_admit_<workflow>): no
// worker serves it, or ever did. The usual cause is a misspelt workflow
// name in the publisher.
type Unserved struct {
	Workflow  string
	Envelopes uint64
}

// FindUnserved lists the workflows whose durable start envelopes no worker
// admits: the subjects of JETFLOW_STARTS that hold messages (stream info
// with a subjects filter) whose workflow has no start consumer. A workflow
// with a consumer but no worker running is not listed: its envelopes wait
// for a worker that is known to exist. Sorted by workflow.
func FindUnserved(ctx context.Context, assets *jetstream.Assets) ([]Unserved, error) {
	info, err := assets.Starts.Info(ctx, natsjs.WithSubjectFilter(StartSubjectPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("jetflow: read %s: %w", jetstream.StartsStream, err)
	}
	if len(info.State.Subjects) == 0 {
		return nil, nil
	}
	consumers := map[string]bool{}
	names := assets.Starts.ConsumerNames(ctx)
	for name := range names.Name() {
		consumers[name] = true
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("jetflow: list the consumers of %s: %w", jetstream.StartsStream, err)
	}
	var out []Unserved
	for subject, n := range info.State.Subjects {
		wf := strings.TrimPrefix(subject, StartSubjectPrefix)
		if n == 0 || consumers[jetstream.StartConsumerName(wf)] {
			continue
		}
		out = append(out, Unserved{Workflow: wf, Envelopes: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Workflow < out[j].Workflow })
	return out, nil
}

// unservedRelog is how often a workflow that stays unserved is logged
// again.
const unservedRelog = 10 * time.Minute

// WatchUnserved samples FindUnserved every interval (default
// metrics.DefaultBacklogInterval) until stopped: it sets the
// jetflow_unserved_start_envelopes gauge to the envelopes found, and logs
// at warn level, naming the workflow, each workflow found unserved (again
// every ten minutes while it stays so). A failed sample is logged at debug
// level and changes nothing. The returned function stops the sampling and
// waits for it to end.
func WatchUnserved(assets *jetstream.Assets, interval time.Duration, m *metrics.Metrics, log zerolog.Logger) (stop func()) {
	if interval <= 0 {
		interval = metrics.DefaultBacklogInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		logged := map[string]time.Time{}
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for ctx.Err() == nil {
			sctx, scancel := context.WithTimeout(ctx, interval)
			found, err := FindUnserved(sctx, assets)
			scancel()
			if err != nil {
				log.Debug().Err(err).Msg("cannot sample start envelopes for unserved workflows")
			} else {
				reportUnserved(found, logged, m, log)
			}
			select {
			case <-ctx.Done():
			case <-ticker.C:
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// reportUnserved sets the gauge and logs the workflows not logged within
// unservedRelog; logged remembers when each was last logged.
func reportUnserved(found []Unserved, logged map[string]time.Time, m *metrics.Metrics, log zerolog.Logger) {
	var total uint64
	now := time.Now()
	seen := make(map[string]bool, len(found))
	for _, u := range found {
		total += u.Envelopes
		seen[u.Workflow] = true
		if last, ok := logged[u.Workflow]; ok && now.Sub(last) < unservedRelog {
			continue
		}
		logged[u.Workflow] = now
		log.Warn().Str("workflow", u.Workflow).Uint64("envelopes", u.Envelopes).
			Str("subject", StartSubjectPrefix+u.Workflow).
			Msg("start envelopes wait for a workflow no worker serves (misspelt workflow name?); they start nothing and expire after the start stream's max age")
	}
	for wf := range logged {
		if !seen[wf] {
			delete(logged, wf) // served, expired or purged: log it anew if it comes back
		}
	}
	m.UnservedStarts(total)
}
