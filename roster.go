package jetflow

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/roster"
)

// Roster is who serves what in the deployment now, as the workers record
// it in the workflows bucket (jetflow_workflows): the workers running now
// and the workflows each serves, and every workflow a worker has ever
// served with the workers serving it now. Its JSON encoding is GET
// /v1/workers's body; its lists are empty, never null.
type Roster struct {
	// Workers are the workers whose liveness records are current, by name
	// (then ID).
	Workers []LiveWorker `json:"workers"`
	// Workflows are the workflows the deployment knows, by name.
	Workflows []KnownWorkflow `json:"workflows"`
}

// LiveWorker is a worker running now: one whose heartbeat keeps its
// liveness records (WorkerConfig.LivenessTTL). A worker that stopped
// withdrew them; one that died is gone once they expire, within a TTL.
type LiveWorker struct {
	// ID tells apart two workers of one name: a new one each time a
	// worker starts.
	ID string `json:"id"`
	// Name is the worker's WorkerConfig.Name.
	Name string `json:"name"`
	// Workflows are the workflows it serves, by name.
	Workflows []string `json:"workflows"`
	// Since is when it started serving them; Beat its latest heartbeat.
	Since time.Time `json:"since"`
	Beat  time.Time `json:"beat"`
	// Protocol is the engine protocol it speaks (EngineProtocol; 0 for a
	// worker of a version before protocol 3: a worker of this version
	// executes nothing while one is live), Build its build identity
	// (WorkerConfig.Build).
	Protocol int    `json:"protocol"`
	Build    string `json:"build,omitempty"`
}

// KnownWorkflow is a workflow a worker of the deployment has served.
type KnownWorkflow struct {
	Workflow string `json:"workflow"`
	// FirstWorker is the name of the worker that served it first, and
	// FirstServed when it started to (zero for a workflow whose record
	// the read did not find, while a worker serves it).
	FirstWorker string    `json:"first_worker,omitempty"`
	FirstServed time.Time `json:"first_served,omitzero"`
	// Workers are the names of the workers serving it now, in the order
	// of Roster.Workers: none, and starts of it wait for a worker (or fail
	// with ErrNoWorker).
	Workers []string `json:"workers"`
}

// Roster reads who serves what now (see Roster): two reads of the
// workflows bucket, whatever the number of runs. It is an operator's
// read, as the inspector's workers view and GET /v1/workers make it.
func (c *Client) Roster(ctx context.Context) (_ Roster, err error) {
	defer func() { err = jetstream.Unavailable(err) }()
	known, live, err := roster.List(ctx, c.assets.Workflows, time.Now())
	if err != nil {
		return Roster{}, err
	}
	return buildRoster(known, live), nil
}

// buildRoster groups the liveness records by worker (their presence ID)
// and joins them to the known records.
func buildRoster(known []roster.Known, live []roster.Presented) Roster {
	out := Roster{Workers: []LiveWorker{}, Workflows: []KnownWorkflow{}}
	byID := map[string]int{}
	for _, l := range live {
		i, ok := byID[l.ID]
		if !ok {
			i = len(out.Workers)
			byID[l.ID] = i
			out.Workers = append(out.Workers, LiveWorker{ID: l.ID, Name: l.Worker, Workflows: []string{}, Since: l.Since, Beat: l.Beat,
				Protocol: l.Protocol, Build: l.Build})
		}
		w := &out.Workers[i]
		w.Workflows = append(w.Workflows, l.Workflow)
		if l.Beat.After(w.Beat) {
			w.Beat = l.Beat
		}
		if l.Since.Before(w.Since) {
			w.Since = l.Since
		}
	}
	slices.SortFunc(out.Workers, func(a, b LiveWorker) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	byName := map[string]int{}
	for _, k := range known {
		byName[k.Workflow] = len(out.Workflows)
		out.Workflows = append(out.Workflows, KnownWorkflow{Workflow: k.Workflow, FirstWorker: k.FirstWorker, FirstServed: k.FirstServed, Workers: []string{}})
	}
	for _, w := range out.Workers {
		slices.Sort(w.Workflows)
		for _, name := range w.Workflows {
			i, ok := byName[name]
			if !ok { // live before its known record is read (a lagging replica)
				i = len(out.Workflows)
				byName[name] = i
				out.Workflows = append(out.Workflows, KnownWorkflow{Workflow: name, Workers: []string{}})
			}
			out.Workflows[i].Workers = append(out.Workflows[i].Workers, w.Name)
		}
	}
	slices.SortFunc(out.Workflows, func(a, b KnownWorkflow) int { return cmp.Compare(a.Workflow, b.Workflow) })
	return out
}
