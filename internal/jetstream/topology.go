package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Names of the engine's NATS resources. They are part of the protocol other
// languages speak (docs/ARCHITECTURE.md), so they never change silently.
const (
	TasksStream  = "JETFLOW_TASKS"
	TaskSubjects = "jetflow.task.>"
	// StartsStream holds start envelopes published by any NATS client on
	// jetflow.start.<workflow> (the durable way in; docs/protocol.md).
	StartsStream = "JETFLOW_STARTS"
	// StartSubjectPrefix + workflow is a workflow's durable start subject.
	StartSubjectPrefix = "jetflow.start."
	StartSubjects      = StartSubjectPrefix + "*"
	RunsBucket         = "jetflow_runs"
	StepsBucket        = "jetflow_steps"
	AuditBucket        = "jetflow_audit"
	// AttemptsBucket counts the attempts of steps that were delivered more
	// than once, keyed by step ID.
	AttemptsBucket = "jetflow_attempts"
)

// TaskSubject is the subject of the start task (stepID empty) of the run
// generation runID (state.RunIdentity) or of the task that runs stepID. One subject per start and per step lets the stream hold
// at most one pending task per subject, which deduplicates tasks durably,
// beyond the broker's duplicate window.
func TaskSubject(workflow, runID, stepID string) string {
	if stepID == "" {
		return "jetflow.task." + workflow + "." + runID
	}
	return "jetflow.task." + workflow + "." + stepID
}

// TaskKind splits a workflow's tasks between two consumers, so that workers
// can favour advancing runs already started over admitting new ones.
type TaskKind int

const (
	// StartTasks: jetflow.task.<workflow>.<run-id>.
	StartTasks TaskKind = iota
	// StepTasks: jetflow.task.<workflow>.<run-id>.<step>.<occurrence>.
	StepTasks
)

// ConsumerName is the durable consumer of kind shared by every worker that
// serves workflow.
func ConsumerName(workflow string, kind TaskKind) string {
	if kind == StartTasks {
		return "jetflow_start_" + workflow
	}
	return "jetflow_step_" + workflow
}

func consumerFilter(workflow string, kind TaskKind) string {
	if kind == StartTasks {
		return "jetflow.task." + workflow + ".*"
	}
	return "jetflow.task." + workflow + ".*.*.*"
}

// Topology is the deployment setting for the engine's streams and buckets.
// Every process of one deployment must use the same values: provisioning is
// create-or-update, so the last process to start wins.
type Topology struct {
	// Replicas for streams and buckets: 1 on a single server, 3 on a
	// three-node cluster.
	Replicas int
	// DuplicateWindow is the broker's Nats-Msg-Id window on the task stream
	// (default 2 minutes). It is only the first line of dedup: admission is
	// decided by the run bucket.
	DuplicateWindow time.Duration
	// Retention is how long run records, step results and audits are kept
	// after their last write (default 30 days). A run ID is remembered for
	// this long; a start after that creates a new run.
	Retention time.Duration
	// MemoryStorage keeps everything in memory (tests and benchmarks of the
	// broker limit only).
	MemoryStorage bool
	// StartMaxAge bounds how long a durable start envelope waits in
	// JETFLOW_STARTS for a worker that serves its workflow (the stream's
	// MaxAge; default DefaultStartMaxAge, 7 days). An envelope older than
	// that is dropped unadmitted, so one published for a workflow no worker
	// serves (a misspelt name) does not wait forever.
	StartMaxAge time.Duration
}

// WithDefaults fills unset fields.
func (t Topology) WithDefaults() Topology {
	if t.Replicas == 0 {
		t.Replicas = 1
	}
	if t.DuplicateWindow == 0 {
		t.DuplicateWindow = 2 * time.Minute
	}
	if t.Retention == 0 {
		t.Retention = 30 * 24 * time.Hour
	}
	return t
}

// Validate names the first bad field.
func (t Topology) Validate() error {
	switch {
	case t.Replicas < 1 || t.Replicas > 5:
		return fmt.Errorf("jetflow: topology: Replicas must be 1..5, got %d", t.Replicas)
	case t.DuplicateWindow < 100*time.Millisecond:
		return fmt.Errorf("jetflow: topology: DuplicateWindow must be at least 100ms, got %s", t.DuplicateWindow)
	case t.Retention < time.Second:
		return fmt.Errorf("jetflow: topology: Retention must be at least 1s, got %s", t.Retention)
	case t.StartMaxAge < 0 || (t.StartMaxAge > 0 && t.StartMaxAge < t.DuplicateWindow):
		return fmt.Errorf("jetflow: topology: StartMaxAge must be 0 (the default) or at least DuplicateWindow (%s), got %s", t.DuplicateWindow, t.StartMaxAge)
	case t.DuplicateWindow > t.Retention:
		return fmt.Errorf("jetflow: topology: DuplicateWindow (%s) longer than Retention (%s)", t.DuplicateWindow, t.Retention)
	}
	return nil
}

// Assets are handles on the provisioned resources.
type Assets struct {
	// Topology is the setting the assets were provisioned with (defaults
	// filled in).
	Topology Topology
	JS       natsjs.JetStream
	Tasks    natsjs.Stream
	// Starts is the durable start stream (JETFLOW_STARTS).
	Starts   natsjs.Stream
	Runs     *KV
	Steps    *KV
	Audit    *KV
	Attempts *KV
	// TaskKeys is the task-keys bucket, provisioned on first use.
	TaskKeys *TaskKeys
}

// Mode says whether Provision may change existing resources.
type Mode int

const (
	// CreateOrUpdate makes the resources match the topology: workers,
	// which own the deployment's settings, provision this way.
	CreateOrUpdate Mode = iota
	// Ensure creates missing resources and binds to existing ones as they
	// are: clients provision this way, so a producer with default settings
	// never rewrites a cluster's replicated setup.
	Ensure
)

// Provision creates (or, in CreateOrUpdate mode, updates) the task and start
// streams and the buckets. It is idempotent: every process calls it at start-up.
func Provision(ctx context.Context, nc *nats.Conn, topo Topology, mode Mode) (*Assets, error) {
	topo = topo.WithDefaults()
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	js, err := natsjs.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetflow: jetstream context: %w", err)
	}
	storage := natsjs.FileStorage
	if topo.MemoryStorage {
		storage = natsjs.MemoryStorage
	}
	tasks, err := ensureStream(ctx, js, mode, natsjs.StreamConfig{
		Name:        TasksStream,
		Description: "jetflow tasks: one message per pending start or step",
		Subjects:    []string{TaskSubjects},
		Retention:   natsjs.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    topo.Replicas,
		Duplicates:  topo.DuplicateWindow,
		// At most one pending task per subject (per start, per step):
		// a second publish while the first is pending is refused.
		Discard:              natsjs.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    1,
	})
	if err != nil {
		return nil, fmt.Errorf("jetflow: provision stream %s: %w", TasksStream, err)
	}
	starts, err := ensureStream(ctx, js, mode, natsjs.StreamConfig{
		Name:        StartsStream,
		Description: "jetflow start envelopes from any NATS client, one per start, until admitted",
		Subjects:    []string{StartSubjects},
		Retention:   natsjs.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    topo.Replicas,
		// Nats-Msg-Id = run ID: a publisher's retry within the window is
		// absorbed by the broker; admission decides after it.
		Duplicates: topo.DuplicateWindow,
		MaxAge:     topo.startMaxAge(),
	})
	if err != nil {
		return nil, fmt.Errorf("jetflow: provision stream %s: %w", StartsStream, err)
	}
	a := &Assets{Topology: topo, JS: js, Tasks: tasks, Starts: starts, TaskKeys: newTaskKeys(js, mode, topo, storage)}
	for _, b := range []struct {
		name    string
		desc    string
		dst     **KV
		markers time.Duration
	}{
		// An expired run record leaves a marker for another retention
		// period, so that a start of its run ID is told the run expired
		// (and run records can carry a per-workflow TTL).
		{RunsBucket, "jetflow run records, keyed by run ID", &a.Runs, topo.Retention},
		{StepsBucket, "jetflow committed step results, keyed by step ID", &a.Steps, 0},
		{AuditBucket, "jetflow duplicate-start audit, keyed by run ID", &a.Audit, 0},
		{AttemptsBucket, "jetflow attempt counts of redelivered steps, keyed by step ID", &a.Attempts, 0},
	} {
		kv, err := ensureBucket(ctx, js, mode, natsjs.KeyValueConfig{
			Bucket:         b.name,
			Description:    b.desc,
			History:        1,
			TTL:            topo.Retention,
			LimitMarkerTTL: b.markers,
			Storage:        storage,
			Replicas:       topo.Replicas,
		})
		if err != nil {
			return nil, fmt.Errorf("jetflow: provision bucket %s: %w", b.name, err)
		}
		*b.dst = newKV(js, kv, topo.Replicas)
	}
	return a, nil
}

func ensureStream(ctx context.Context, js natsjs.JetStream, mode Mode, cfg natsjs.StreamConfig) (natsjs.Stream, error) {
	if mode == CreateOrUpdate {
		return js.CreateOrUpdateStream(ctx, cfg)
	}
	s, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, natsjs.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, cfg)
		if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
			return js.Stream(ctx, cfg.Name)
		}
	}
	return s, err
}

func ensureBucket(ctx context.Context, js natsjs.JetStream, mode Mode, cfg natsjs.KeyValueConfig) (natsjs.KeyValue, error) {
	if mode == CreateOrUpdate {
		return js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, natsjs.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, natsjs.ErrBucketExists) {
			return js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return kv, err
}

// ConsumerConfig is the per-workflow task consumer setting.
type ConsumerConfig struct {
	AckWait       time.Duration
	MaxAckPending int
}

// EnsureConsumer creates or updates the durable consumer of kind for
// workflow.
func (a *Assets) EnsureConsumer(ctx context.Context, workflow string, kind TaskKind, cc ConsumerConfig) (natsjs.Consumer, error) {
	return a.ensureConsumer(ctx, TasksStream, ConsumerName(workflow, kind), consumerFilter(workflow, kind),
		"jetflow tasks of workflow "+workflow, cc)
}

// ensureConsumer creates or updates a durable, explicitly acked pull
// consumer; deliveries are not limited (the engine counts attempts).
func (a *Assets) ensureConsumer(ctx context.Context, stream, durable, filter, desc string, cc ConsumerConfig) (natsjs.Consumer, error) {
	c, err := a.JS.CreateOrUpdateConsumer(ctx, stream, natsjs.ConsumerConfig{
		Durable:       durable,
		Description:   desc,
		FilterSubject: filter,
		AckPolicy:     natsjs.AckExplicitPolicy,
		AckWait:       cc.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: cc.MaxAckPending,
		DeliverPolicy: natsjs.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("jetflow: consumer %s on %s: %w", durable, stream, err)
	}
	return c, nil
}

// StartConsumerName is the durable consumer of workflow's start envelopes on
// JETFLOW_STARTS, shared by every worker that serves workflow.
func StartConsumerName(workflow string) string { return "jetflow_admit_" + workflow }

// EnsureStartConsumer creates or updates the durable consumer of
// workflow's start envelopes (jetflow.start.<workflow>).
func (a *Assets) EnsureStartConsumer(ctx context.Context, workflow string, cc ConsumerConfig) (natsjs.Consumer, error) {
	return a.ensureConsumer(ctx, StartsStream, StartConsumerName(workflow), StartSubjectPrefix+workflow,
		"jetflow start envelopes of workflow "+workflow, cc)
}
