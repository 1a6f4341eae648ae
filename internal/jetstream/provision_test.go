package jetstream

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// logged is one call of a LogChanges function.
type logged struct {
	msg string
	kv  []any
}

// changeLog collects LogChanges calls.
type changeLog struct {
	mu    sync.Mutex
	lines []logged
}

func (l *changeLog) log(msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, logged{msg, kv})
}

func (l *changeLog) take() []logged {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.lines
	l.lines = nil
	return out
}

// TestProvisionLogsWhatItChanges: a duplicate window an operator changed on
// the task stream is put back at the next CreateOrUpdate provisioning and
// logged with the field, the operator's value and jetflow's; a bucket's
// changed retention likewise; a provisioning that changes nothing logs
// nothing.
func TestProvisionLogsWhatItChanges(t *testing.T) {
	t.Parallel()
	nc := embeddedConn(t)
	var changes changeLog

	a, err := Provision(ctx(t), nc, Topology{}, CreateOrUpdate, LogChanges(changes.log))
	require.NoError(t, err)
	require.Empty(t, changes.take(), "creating is no change")

	// An operator shortens the window by hand.
	info, err := a.Tasks.Info(ctx(t))
	require.NoError(t, err)
	cfg := info.Config
	cfg.Duplicates = 30 * time.Second
	_, err = a.JS.UpdateStream(ctx(t), cfg)
	require.NoError(t, err)

	a, err = Provision(ctx(t), nc, Topology{}, CreateOrUpdate, LogChanges(changes.log))
	require.NoError(t, err)
	require.Equal(t, []logged{{"stream configuration changed at start-up",
		[]any{"stream", TasksStream, "changes", []string{"Duplicates: 30s → 2m0s"}}}}, changes.take())
	info, err = a.Tasks.Info(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 2*time.Minute, info.Config.Duplicates)

	// A setting given to the worker: every stream and bucket it touches.
	_, err = Provision(ctx(t), nc, Topology{DuplicateWindow: 30 * time.Second, Retention: 48 * time.Hour}, CreateOrUpdate, LogChanges(changes.log))
	require.NoError(t, err)
	byName := map[string][]string{}
	for _, l := range changes.take() {
		byName[l.kv[1].(string)] = l.kv[3].([]string)
	}
	require.Equal(t, []string{"Duplicates: 2m0s → 30s"}, byName[TasksStream])
	require.Equal(t, []string{"Duplicates: 2m0s → 30s"}, byName[StartsStream])
	require.Equal(t, []string{"TTL: 720h0m0s → 48h0m0s", "LimitMarkerTTL: 720h0m0s → 48h0m0s"}, byName[RunsBucket])
	require.Equal(t, []string{"TTL: 720h0m0s → 48h0m0s"}, byName[AuditBucket])
	require.NotContains(t, byName, StepsBucket, "a run's records have no age limit")

	// Ensure mode (clients) never changes anything, so never logs.
	_, err = Provision(ctx(t), nc, Topology{}, Ensure, LogChanges(changes.log))
	require.NoError(t, err)
	require.Empty(t, changes.take())
	_, err = Provision(ctx(t), nc, Topology{DuplicateWindow: 30 * time.Second, Retention: 48 * time.Hour}, CreateOrUpdate, LogChanges(changes.log))
	require.NoError(t, err)
	require.Empty(t, changes.take(), "the same topology again changes nothing")
}
