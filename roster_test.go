package jetflow

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/roster"
)

// Client.Roster says who serves what now: each running worker with the
// workflows it serves, each workflow ever served with who served it first
// and who serves it now; a stopped worker is gone from both, and its
// workflow stays known, served by nobody. Its JSON lists are never null.
func TestRosterListsWorkersAndWorkflows(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Topology{})
	c := env.client()
	ctx := ctxT(t, 30*time.Second)

	r, err := c.Roster(ctx)
	require.NoError(t, err)
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.JSONEq(t, `{"workers":[],"workflows":[]}`, string(b), "no worker has run yet")

	env.worker(WorkerConfig{Name: "billing-1"}, threeSteps("invoice", newCounter()), threeSteps("refund", newCounter()))
	w := startWorker(t, env.conn(), WorkerConfig{Name: "mailer-1"}, threeSteps("welcome", newCounter()), threeSteps("refund", newCounter()))
	r, err = c.Roster(ctx)
	require.NoError(t, err)
	require.Len(t, r.Workers, 2)
	require.Equal(t, "billing-1", r.Workers[0].Name)
	require.Equal(t, []string{"invoice", "refund"}, r.Workers[0].Workflows)
	require.Equal(t, "mailer-1", r.Workers[1].Name)
	require.Equal(t, []string{"refund", "welcome"}, r.Workers[1].Workflows)
	for _, lw := range r.Workers {
		require.NotEmpty(t, lw.ID)
		require.False(t, lw.Since.IsZero())
		require.False(t, lw.Beat.Before(lw.Since))
	}
	require.NotEqual(t, r.Workers[0].ID, r.Workers[1].ID)
	names := make([]string, len(r.Workflows))
	for i, kw := range r.Workflows {
		names[i] = kw.Workflow
		require.False(t, kw.FirstServed.IsZero(), kw.Workflow)
	}
	require.Equal(t, []string{"invoice", "refund", "welcome"}, names)
	require.Equal(t, []string{"billing-1", "mailer-1"}, r.Workflows[1].Workers, "refund: served by both")
	require.Equal(t, "mailer-1", r.Workflows[2].FirstWorker)

	require.NoError(t, w.Stop(ctx))
	r, err = c.Roster(ctx)
	require.NoError(t, err)
	require.Len(t, r.Workers, 1, "the stopped worker withdrew")
	require.Equal(t, "billing-1", r.Workers[0].Name)
	require.Equal(t, "welcome", r.Workflows[2].Workflow, "known for good")
	require.Empty(t, r.Workflows[2].Workers, "served by nobody now")
	require.Equal(t, []string{"billing-1"}, r.Workflows[1].Workers)
}

// A Roster's JSON: snake_case in a fixed order, lists never null; a
// workflow served now whose known record the read did not find (a lagging
// replica) is listed without its first worker.
func TestRosterJSON(t *testing.T) {
	t.Parallel()
	r := buildRoster([]roster.Known{{Workflow: "ship", FirstWorker: "w1", FirstServed: jsonAt}},
		[]roster.Presented{
			{Live: roster.Live{Workflow: "ship", Worker: "w1", Since: jsonAt, Beat: jsonAt.Add(time.Second), Protocol: 3, Build: "b7"}, ID: "A"},
			{Live: roster.Live{Workflow: "bill", Worker: "w1", Since: jsonAt, Beat: jsonAt.Add(2 * time.Second), Protocol: 3, Build: "b7"}, ID: "A"},
		})
	require.Equal(t, `{"workers":[{"id":"A","name":"w1","workflows":["bill","ship"],"since":"2025-01-02T03:04:05Z","beat":"2025-01-02T03:04:07Z","protocol":3,"build":"b7"}],`+
		`"workflows":[{"workflow":"bill","workers":["w1"]},`+
		`{"workflow":"ship","first_worker":"w1","first_served":"2025-01-02T03:04:05Z","workers":["w1"]}]}`+"\n", encodeJSON(t, r))
	require.Equal(t, `{"workers":[],"workflows":[{"workflow":"ship","first_worker":"w1","first_served":"2025-01-02T03:04:05Z","workers":[]}]}`+"\n",
		encodeJSON(t, buildRoster([]roster.Known{{Workflow: "ship", FirstWorker: "w1", FirstServed: jsonAt}}, nil)))
}
