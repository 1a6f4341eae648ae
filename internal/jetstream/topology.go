package jetstream

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/jetflow/jetflow/internal/logging"
	"github.com/jetflow/jetflow/jetflowtype"
)

// Names of the engine's NATS resources. They are part of the protocol other
// languages speak (docs/ARCHITECTURE.md), so they never change silently.
const (
	// TasksStream holds every task: run tasks (jetflow.run.<workflow>.<identity>)
	// and branch tasks (jetflow.branch.<workflow>.<step-id>), at most one
	// pending per subject.
	TasksStream = "JETFLOW_TASKS"
	// RunSubjects are the subjects of run tasks: a run's start and every
	// later hand-over of its body to a holder (internal/workflow).
	RunSubjects = "jetflow.run.>"
	// BranchSubjects are the subjects of branch tasks: one step a body
	// started beside others (Go), run on its own.
	BranchSubjects = "jetflow.branch.>"
	// LegacyTaskSubjects are the task subjects of versions before the
	// lease executor (jetflow.task.<workflow>.<run-id>[.<step>.<n>]).
	// They stay in the stream until such a version's runs have been taken
	// over (docs/operations.md, "Upgrading the engine"): this version
	// publishes on them only the resume of a run not taken over yet, and
	// reads them only through that version's consumers (LegacyConsumerNames).
	LegacyTaskSubjects = "jetflow.task.>"
	// StartsStream holds start envelopes published by any NATS client on
	// jetflow.start.<workflow> (the durable way in; docs/protocol.md).
	StartsStream = "JETFLOW_STARTS"
	// StartSubjectPrefix + workflow is a workflow's durable start subject.
	StartSubjectPrefix = "jetflow.start."
	StartSubjects      = StartSubjectPrefix + "*"
	RunsBucket         = "jetflow_runs"
	// StepsBucket holds committed step results, keyed by step ID, and each
	// run generation's lease (state.LeaseKey).
	StepsBucket = "jetflow_steps"
	AuditBucket = "jetflow_audit"
	// AttemptsBucket counts the attempts of steps that were delivered more
	// than once, keyed by step ID.
	AttemptsBucket = "jetflow_attempts"
	// WorkflowsBucket records which workflows the deployment has ever
	// served (a permanent record per workflow) and which workers serve
	// them now (a record per worker and workflow, with a per-message TTL
	// that the worker's heartbeat refreshes). See internal/roster.
	WorkflowsBucket = "jetflow_workflows"
	// HooksBucket maps hook tokens to the waits they resume (state.Hook),
	// keyed by token; internal/workflow's HookTokens owns it.
	HooksBucket = "jetflow_hooks"
	// WorkflowsMarkerTTL is how long the marker of an expired or withdrawn
	// liveness record stays in WorkflowsBucket (its LimitMarkerTTL): long
	// enough for a watcher to see it, short enough that workers coming
	// and going leave nothing behind.
	WorkflowsMarkerTTL = time.Minute
	// IndexStream is the run index (internal/runindex): one entry per
	// kept run, on a subject naming its status, workflow and run ID.
	IndexStream   = "JETFLOW_RUN_INDEX"
	IndexSubjects = "jetflow.runindex.>"
	// CancelSubjectPrefix + run ID is where Client.Cancel tells workers a
	// run was cancelled (core NATS, the run's token as the body).
	CancelSubjectPrefix = "jetflow.cancel."
)

// RunSubject is the subject of the run tasks of the run generation
// identity (state.RunIdentity): its start task, then every wake. One
// subject per run generation holds at most one pending task, so a run
// has at most one run task pending at a time, and a wake published while
// one is pending is absorbed by it.
func RunSubject(workflow, identity string) string {
	return "jetflow.run." + workflow + "." + identity
}

// IsRunSubject reports whether subject is a run task's.
func IsRunSubject(subject string) bool { return strings.HasPrefix(subject, "jetflow.run.") }

// BranchSubject is the subject of the task that runs the branch stepID.
func BranchSubject(workflow, stepID string) string {
	return "jetflow.branch." + workflow + "." + stepID
}

// LegacyResumeSubject is the subject on which an earlier version's workers
// take the resume task of their run's step stepID (an event delivered, a
// child ended).
func LegacyResumeSubject(workflow, stepID string) string {
	return "jetflow.task." + workflow + "." + stepID + "-resume"
}

// TaskKind splits a workflow's tasks between two consumers.
type TaskKind int

const (
	// RunTasks: jetflow.run.<workflow>.<identity>.
	RunTasks TaskKind = iota
	// BranchTasks: jetflow.branch.<workflow>.<identity>.<step>.<occurrence>.
	BranchTasks
)

// ConsumerName is the durable consumer of kind shared by every worker that
// serves workflow.
func ConsumerName(workflow string, kind TaskKind) string {
	if kind == RunTasks {
		return "jetflow_run_" + workflow
	}
	return "jetflow_branch_" + workflow
}

func consumerFilter(workflow string, kind TaskKind) string {
	if kind == RunTasks {
		return "jetflow.run." + workflow + ".*"
	}
	return "jetflow.branch." + workflow + ".>"
}

// LegacyDueConsumer is the due-timer consumer on TimersStream of the
// executor before the lease (see LegacyConsumerNames).
const LegacyDueConsumer = "jetflow_due"

// LegacyConsumerNames are the task consumers the executor before the lease
// made for workflow (start tasks, step tasks): a worker of this version
// takes over the runs of what they and LegacyDueConsumer deliver
// (workflow.Executor.Legacy), and never creates or changes them.
func LegacyConsumerNames(workflow string) []string {
	return []string{"jetflow_start_" + workflow, "jetflow_step_" + workflow}
}

// Topology is the deployment setting for the engine's streams and buckets
// (jetflowtype.Topology, the root package's Topology). Every process of
// one deployment must use the same values: provisioning is create-or-update,
// so the last process to start wins.
type Topology = jetflowtype.Topology

// TopologyWithDefaults is t with its unset fields filled.
func TopologyWithDefaults(t Topology) Topology {
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

// ValidateTopology names the first bad field of t.
func ValidateTopology(t Topology) error {
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
	Starts natsjs.Stream
	// Timers holds tasks until they are due (JETFLOW_TIMERS).
	Timers   natsjs.Stream
	Runs     *KV
	Steps    *KV
	Audit    *KV
	Attempts *KV
	// Workflows is WorkflowsBucket: known workflows and live workers.
	Workflows *KV
	// Hooks is HooksBucket: hook tokens.
	Hooks *KV
	// TaskKeys is the task-keys bucket, provisioned on first use.
	TaskKeys *TaskKeys
	// Index is the run index stream (IndexStream).
	Index natsjs.Stream
	// IndexFailed, when set, is told of a run index write that failed
	// after its run record was written (internal/runs); the process that
	// provisioned sets it to its logger.
	IndexFailed func(runID string, err error)
	// BeforeIndex, when set, runs after a run record's write that changed
	// its status and before the index entry's: a crash point for tests (a
	// process killed between the two).
	BeforeIndex func(runID string)
	// AfterCreate, when set, runs after a run record's create-if-absent
	// write succeeded and before anything else: a crash point for tests.
	AfterCreate func(runID string)

	attempt time.Duration // bounds one try of a consumer request (apiAttempt)
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
// streams and the buckets. It is idempotent: every process calls it at
// start-up. LogChanges reports the updates.
func Provision(ctx context.Context, nc *nats.Conn, topo Topology, mode Mode, opts ...ProvisionOption) (*Assets, error) {
	topo = TopologyWithDefaults(topo)
	if err := ValidateTopology(topo); err != nil {
		return nil, err
	}
	js, err := natsjs.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetflow: jetstream context: %w", err)
	}
	p := provisioner{js: js, mode: mode, attempt: apiAttempt}
	for _, o := range opts {
		o(&p)
	}
	storage := natsjs.FileStorage
	if topo.MemoryStorage {
		storage = natsjs.MemoryStorage
	}
	tasks, err := p.ensureStream(ctx, natsjs.StreamConfig{
		Name:        TasksStream,
		Description: "jetflow tasks: one message per pending run hand-over or branch step",
		Subjects:    executorSubjects[TasksStream],
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
	starts, err := p.ensureStream(ctx, natsjs.StreamConfig{
		Name:        StartsStream,
		Description: "jetflow start envelopes from any NATS client, one per start, until admitted",
		Subjects:    []string{StartSubjects},
		Retention:   natsjs.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    topo.Replicas,
		// Nats-Msg-Id = run ID: a publisher's retry within the window is
		// absorbed by the broker; admission decides after it.
		Duplicates: topo.DuplicateWindow,
		MaxAge:     startMaxAge(topo),
	})
	if err != nil {
		return nil, fmt.Errorf("jetflow: provision stream %s: %w", StartsStream, err)
	}
	timers, err := p.ensureStream(ctx, natsjs.StreamConfig{
		Name:        TimersStream,
		Description: "jetflow timers: tasks stored until they are due (retry backoffs, sleeps, wait timeouts), then published to " + fireSubjects,
		Subjects:    executorSubjects[TimersStream],
		Retention:   natsjs.WorkQueuePolicy,
		Storage:     storage,
		Replicas:    topo.Replicas,
		Duplicates:  topo.DuplicateWindow,
		// Message schedules (server 2.12+): the server publishes a stored
		// timer to its target subject when it is due.
		AllowMsgSchedules: true,
		AllowRollup:       true,
	})
	if err != nil {
		return nil, fmt.Errorf("jetflow: provision stream %s: %w", TimersStream, err)
	}
	index, err := p.ensureStream(ctx, indexStreamConfig(topo, storage))
	if err != nil {
		return nil, fmt.Errorf("jetflow: provision stream %s: %w", IndexStream, err)
	}
	direct := newDirectMux(nc)
	a := &Assets{Topology: topo, JS: js, Tasks: tasks, Starts: starts, Timers: timers, Index: index,
		TaskKeys: newTaskKeys(p, topo, storage), attempt: p.attempt}
	for _, b := range []struct {
		name    string
		desc    string
		dst     **KV
		ttl     time.Duration
		markers time.Duration
	}{
		// An expired run record leaves a marker for another retention
		// period, so that a start of its run ID is told the run expired
		// (and run records can carry a per-workflow TTL).
		{RunsBucket, "jetflow run records, keyed by run ID", &a.Runs, topo.Retention, topo.Retention},
		{AuditBucket, "jetflow duplicate-start audit, keyed by run ID", &a.Audit, topo.Retention, 0},
		// A run generation's records have no age limit: they are kept
		// as long as the run runs, and removed the run's retention after
		// its end (RunRecordBuckets).
		{StepsBucket, "jetflow committed step results, keyed by step ID", &a.Steps, 0, 0},
		{AttemptsBucket, "jetflow attempt logs of retried steps and the waits runs began, keyed by step ID", &a.Attempts, 0, 0},
		{HooksBucket, "jetflow hook tokens, keyed by token: the wait each resumes", &a.Hooks, 0, 0},
	} {
		kv, err := p.ensureBucket(ctx, natsjs.KeyValueConfig{
			Bucket:         b.name,
			Description:    b.desc,
			History:        1,
			TTL:            b.ttl,
			LimitMarkerTTL: b.markers,
			Storage:        storage,
			Replicas:       topo.Replicas,
		})
		if err != nil {
			return nil, fmt.Errorf("jetflow: provision bucket %s: %w", b.name, err)
		}
		*b.dst = newKV(js, kv, topo.Replicas, direct)
	}
	// No bucket TTL: a workflow, once served, stays known; liveness
	// records carry their own TTL (per-message, hence LimitMarkerTTL).
	kv, err := p.ensureBucket(ctx, natsjs.KeyValueConfig{
		Bucket:         WorkflowsBucket,
		Description:    "jetflow workflows: known.<workflow> once served, live.<workflow>.<worker> while served",
		History:        1,
		LimitMarkerTTL: WorkflowsMarkerTTL,
		Storage:        storage,
		Replicas:       topo.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("jetflow: provision bucket %s: %w", WorkflowsBucket, err)
	}
	a.Workflows = newKV(js, kv, topo.Replicas, direct)
	return a, nil
}

// indexStreamConfig is the run index stream's configuration.
func indexStreamConfig(topo Topology, storage natsjs.StorageType) natsjs.StreamConfig {
	return natsjs.StreamConfig{
		Name:        IndexStream,
		Description: "jetflow run index: one entry per kept run, for pages of runs newest first (internal/runindex)",
		Subjects:    []string{IndexSubjects},
		Storage:     storage,
		Replicas:    topo.Replicas,
		// A run has one entry (the writer removes the one it replaces),
		// which expires with its run record (per-message TTL). No
		// per-subject limit: with one, the server counts pending
		// messages subject by subject, and every batched read walks all
		// the index's subjects (bench/RESULTS.md, the index phase).
		MaxMsgsPerSubject: -1,
		AllowMsgTTL:       true,
		AllowDirect:       true,
	}
}

// EnsureIndexStream creates the run index stream again if it is missing
// (deleted while the process ran), as Provision made it; it leaves an
// existing one as it is. Handles on it stay valid: requests name the
// stream.
func (a *Assets) EnsureIndexStream(ctx context.Context) error {
	storage := natsjs.FileStorage
	if a.Topology.MemoryStorage {
		storage = natsjs.MemoryStorage
	}
	p := provisioner{js: a.JS, mode: Ensure, attempt: a.attempt}
	if _, err := p.ensureStream(ctx, indexStreamConfig(a.Topology, storage)); err != nil {
		return fmt.Errorf("jetflow: provision stream %s: %w", IndexStream, err)
	}
	return nil
}

// ProvisionOption configures Provision.
type ProvisionOption func(*provisioner)

// LogChanges makes Provision (and the task-keys bucket's provisioning on
// first use) call log when it changes an existing stream's or bucket's
// configuration, with what changed, from what to what: key/value pairs
// "stream" or "bucket" (the name) and "changes" (a list of
// "Field: old → new"). An operator's change to a setting jetflow manages
// (the duplicate window, say) is put back at a worker's start; this says
// so instead of doing it silently.
func LogChanges(log func(msg string, kv ...any)) ProvisionOption {
	return func(p *provisioner) { p.log = log }
}

// provisioner creates and binds streams and buckets in one Mode.
type provisioner struct {
	js      natsjs.JetStream
	mode    Mode
	log     func(msg string, kv ...any) // nil: no log
	attempt time.Duration               // bounds one try of a request (apiAttempt)
}

// apiAttempt bounds one try of a JetStream API request made to create or
// bind a stream, bucket or consumer. A clustered JetStream without a meta
// leader (electing one, or with too few nodes up yet) does not answer
// such a request at all: the request is lost, not queued, and a caller
// that waited for its answer until its own deadline would wait in vain
// after the leader is back. nats.go's own default for an API request.
const apiAttempt = 5 * time.Second

// apiPatience bounds retried when its context has no deadline: a caller
// that set none (context.Background) gets an answer in bounded time, as
// it did from a single request with nats.go's default timeout.
const apiPatience = 30 * time.Second

// retried calls f until f succeeds, fails with an error that is not
// transient (IsTransient) or on a closed connection, or ctx ends (apiPatience after the first call
// when ctx has no deadline), and returns f's last result.
// Each call gets a context that ends after attempt (apiAttempt when not
// positive) or with ctx; between two calls it pauses, from 100ms
// doubling to 1s. f must be idempotent: a try that timed out may have
// taken effect (its answer was lost), and the next one must find what it
// did — ensureStream, ensureBucket and ensureConsumer read before they
// create, and treat "already exists" as found.
func retried[T any](ctx context.Context, attempt time.Duration, f func(context.Context) (T, error)) (T, error) {
	if attempt <= 0 {
		attempt = apiAttempt
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, apiPatience)
		defer cancel()
	}
	pause := 100 * time.Millisecond
	for {
		try, cancel := context.WithTimeout(ctx, attempt)
		v, err := f(try)
		cancel()
		if err == nil || !IsTransient(err) || ctx.Err() != nil || errors.Is(err, nats.ErrConnectionClosed) {
			return v, err // a closed connection does not come back
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}

// ensureStream creates the stream cfg describes, or binds to it; in
// CreateOrUpdate mode it also updates an existing stream whose settings
// differ, and logs what it changed. A stream already as wanted is not
// updated: every worker start would otherwise send an update to the
// stream (a replicated proposal in a cluster) while other workers create
// consumers on it.
// Each try is bounded by p.attempt and retried while it fails transiently
// (retried).
func (p provisioner) ensureStream(ctx context.Context, cfg natsjs.StreamConfig) (natsjs.Stream, error) {
	return retried(ctx, p.attempt, func(ctx context.Context) (natsjs.Stream, error) { return p.ensureStreamOnce(ctx, cfg) })
}

func (p provisioner) ensureStreamOnce(ctx context.Context, cfg natsjs.StreamConfig) (natsjs.Stream, error) {
	s, err := p.js.Stream(ctx, cfg.Name)
	if err == nil && p.mode == CreateOrUpdate {
		if changes := diff(cfg, s.CachedInfo().Config); len(changes) > 0 {
			s, err = p.js.UpdateStream(ctx, cfg)
			if err == nil {
				p.logChanges("stream configuration changed at start-up", "stream", cfg.Name, changes)
			}
			return s, err
		}
	}
	if errors.Is(err, natsjs.ErrStreamNotFound) {
		s, err = p.js.CreateStream(ctx, cfg)
		if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
			return p.js.Stream(ctx, cfg.Name)
		}
	}
	return s, err
}

// ensureBucket is ensureStream for a KV bucket.
func (p provisioner) ensureBucket(ctx context.Context, cfg natsjs.KeyValueConfig) (natsjs.KeyValue, error) {
	return retried(ctx, p.attempt, func(ctx context.Context) (natsjs.KeyValue, error) { return p.ensureBucketOnce(ctx, cfg) })
}

func (p provisioner) ensureBucketOnce(ctx context.Context, cfg natsjs.KeyValueConfig) (natsjs.KeyValue, error) {
	kv, err := p.js.KeyValue(ctx, cfg.Bucket)
	if err == nil && p.mode == CreateOrUpdate {
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, err
		}
		changes := []string{"(configuration unreadable: set as a whole)"}
		if bs, ok := st.(*natsjs.KeyValueBucketStatus); ok {
			changes = bucketDiff(cfg, bs.Config())
		}
		if len(changes) > 0 {
			kv, err = p.js.UpdateKeyValue(ctx, cfg)
			if err == nil {
				p.logChanges("bucket configuration changed at start-up", "bucket", cfg.Bucket, changes)
			}
			return kv, err
		}
		return kv, nil
	}
	if errors.Is(err, natsjs.ErrBucketNotFound) {
		kv, err = p.js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, natsjs.ErrBucketExists) {
			return p.js.KeyValue(ctx, cfg.Bucket)
		}
	}
	return kv, err
}

func (p provisioner) logChanges(msg, kind, name string, changes []string) {
	if p.log != nil {
		p.log(msg, kind, name, "changes", changes)
	}
}

// diff lists, as "Field: have → want", the settings of want that a
// resource configured as have lacks; none when it already has them all. A
// zero field of want is a setting jetflow leaves to the server's default,
// so have's value stands for it (jetflow never lowers a setting to zero:
// every field it sets deliberately is non-zero, or zero from creation on).
func diff[C any](want, have C) []string {
	w, h := reflect.ValueOf(want), reflect.ValueOf(have)
	var out []string
	for i := range w.NumField() {
		wf, hf := w.Field(i), h.Field(i)
		if wf.IsZero() || reflect.DeepEqual(wf.Interface(), hf.Interface()) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %v → %v", w.Type().Field(i).Name, hf.Interface(), wf.Interface()))
	}
	return out
}

// bucketDiff is diff for a bucket, whose TTL is always jetflow's: a
// bucket without one (its keys are removed by jetflow, or expire with
// their own TTL) is put back to none when it has one.
func bucketDiff(want, have natsjs.KeyValueConfig) []string {
	changes := diff(want, have)
	if want.TTL == 0 && have.TTL != 0 {
		changes = append(changes, fmt.Sprintf("TTL: %v → none", have.TTL))
	}
	return changes
}

// RunRecordBuckets are the buckets whose keys belong to one run
// generation (state.RunIdentity): its steps and lease, its attempt and
// wait records, its hook tokens. They have no age limit: a run's records
// are kept however long the run runs, and removed the run's retention
// after its end (internal/workflow, Expire). A worker of the version
// before provisions them with the deployment's retention as their TTL,
// which would expire the records of a run older than that: RestoreBuckets
// takes it off again.
var RunRecordBuckets = []string{StepsBucket, AttemptsBucket, HooksBucket}

// RestoreBuckets takes off the age limit (MaxAge) an earlier version's
// worker put on RunRecordBuckets when it started, and returns the buckets
// it changed. A repeat call changes nothing. A worker of this version
// calls it periodically, with RestoreSubjects.
func (a *Assets) RestoreBuckets(ctx context.Context) ([]string, error) {
	var changed []string
	for _, name := range RunRecordBuckets {
		s, err := a.JS.Stream(ctx, "KV_"+name)
		if err != nil {
			return changed, fmt.Errorf("jetflow: read bucket %s: %w", name, err)
		}
		cfg := s.CachedInfo().Config
		if cfg.MaxAge == 0 {
			continue
		}
		cfg.MaxAge = 0
		if _, err := a.JS.UpdateStream(ctx, cfg); err != nil {
			return changed, fmt.Errorf("jetflow: take the age limit off bucket %s: %w", name, err)
		}
		changed = append(changed, name)
	}
	return changed, nil
}

// ConsumerConfig is the per-workflow task consumer setting.
type ConsumerConfig struct {
	// AckWait is the consumer's AckWait when this process creates it. An
	// existing consumer keeps the deployment's value (every worker follows
	// it) unless ApplyAckWait is set.
	AckWait time.Duration
	// ApplyAckWait makes AckWait the deployment's value on an existing
	// consumer too. ensureConsumer raises it at once; a lower value is left
	// to LowerAckWait, which running workers follow before the broker
	// shortens the deadline.
	ApplyAckWait  bool
	MaxAckPending int
	// Log receives a line when an existing consumer's AckWait is kept or
	// changed (nil: none).
	Log func(msg string, kv ...any)
}

// LoweringMetadata is the consumer metadata key that announces a lower
// AckWait about to be applied: every worker heartbeats against the lower of
// the two from the moment it reads it (EffectiveAckWait).
const LoweringMetadata = "jetflow_ack_wait_lowering"

// EffectiveAckWait is the ack deadline a holder of cfg's messages must
// heartbeat against: the consumer's AckWait, or a lower one announced in
// its metadata.
func EffectiveAckWait(cfg natsjs.ConsumerConfig) time.Duration {
	d := cfg.AckWait
	if d <= 0 {
		d = 30 * time.Second // the server's default
	}
	if v, ok := cfg.Metadata[LoweringMetadata]; ok {
		if l, err := time.ParseDuration(v); err == nil && l > 0 && l < d {
			d = l
		}
	}
	return d
}

// MaxAckWaitRefresh bounds how long a worker goes without re-reading a
// consumer's AckWait.
const MaxAckWaitRefresh = 5 * time.Second

// AckWaitRefresh is how often a worker re-reads the AckWait of a consumer
// whose effective AckWait is ackWait: a third of it, between 250ms and
// MaxAckWaitRefresh.
func AckWaitRefresh(ackWait time.Duration) time.Duration {
	return min(max(ackWait/3, 250*time.Millisecond), MaxAckWaitRefresh)
}

// EnsureConsumer creates the durable consumer of kind for workflow, or
// binds to it as it is (see ConsumerConfig.ApplyAckWait).
func (a *Assets) EnsureConsumer(ctx context.Context, workflow string, kind TaskKind, cc ConsumerConfig) (natsjs.Consumer, error) {
	return a.ensureConsumer(ctx, TasksStream, ConsumerName(workflow, kind), consumerFilter(workflow, kind),
		"jetflow tasks of workflow "+workflow, cc)
}

// ensureConsumer creates a durable, explicitly acked pull consumer, or
// binds to the existing one; deliveries are not limited (the engine counts
// attempts). The consumer's AckWait and MaxAckPending are the deployment's:
// the first process creates them, later ones follow them, and only
// ApplyAckWait changes AckWait. Each try is bounded and retried as
// ensureStream's.
func (a *Assets) ensureConsumer(ctx context.Context, stream, durable, filter, desc string, cc ConsumerConfig) (natsjs.Consumer, error) {
	return retried(ctx, a.attempt, func(ctx context.Context) (natsjs.Consumer, error) {
		return a.ensureConsumerOnce(ctx, stream, durable, filter, desc, cc)
	})
}

func (a *Assets) ensureConsumerOnce(ctx context.Context, stream, durable, filter, desc string, cc ConsumerConfig) (natsjs.Consumer, error) {
	cfg := natsjs.ConsumerConfig{
		Durable:       durable,
		Description:   desc,
		FilterSubject: filter,
		AckPolicy:     natsjs.AckExplicitPolicy,
		AckWait:       cc.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: cc.MaxAckPending,
		DeliverPolicy: natsjs.DeliverAllPolicy,
	}
	c, err := a.JS.Consumer(ctx, stream, durable)
	if errors.Is(err, natsjs.ErrConsumerNotFound) {
		c, err = a.JS.CreateConsumer(ctx, stream, cfg)
		if errors.Is(err, natsjs.ErrConsumerExists) {
			c, err = a.JS.Consumer(ctx, stream, durable)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("jetflow: consumer %s on %s: %w", durable, stream, err)
	}
	have := c.CachedInfo().Config
	if have.FilterSubject != filter {
		// Written by an older version, or by hand: the filter decides
		// which tasks the consumer sees, so it is always put right.
		have.FilterSubject = filter
		if c, err = a.JS.UpdateConsumer(ctx, stream, have); err != nil {
			return nil, fmt.Errorf("jetflow: consumer %s on %s: %w", durable, stream, err)
		}
		have = c.CachedInfo().Config
	}
	switch {
	case cc.AckWait == 0 || have.AckWait == cc.AckWait && have.Metadata[LoweringMetadata] == "":
	case !cc.ApplyAckWait:
		cc.log("consumer keeps the deployment's AckWait; this process's setting is not applied",
			"consumer", durable, "ack_wait", have.AckWait.String(), "configured", cc.AckWait.String())
	case cc.AckWait > have.AckWait:
		// Raising is safe at once: heartbeats sent for the shorter
		// deadline are more frequent than the longer one needs.
		have.AckWait = cc.AckWait
		delete(have.Metadata, LoweringMetadata)
		if c, err = a.JS.UpdateConsumer(ctx, stream, have); err != nil {
			return nil, fmt.Errorf("jetflow: consumer %s on %s: raise AckWait: %w", durable, stream, err)
		}
		cc.log("consumer AckWait raised", "consumer", durable, "ack_wait", cc.AckWait.String())
	default:
		// Lowering waits for running workers: LowerAckWait, once every
		// consumer of the process is bound.
	}
	return c, nil
}

// LowerAckWait makes to the AckWait of every consumer in consumers whose
// AckWait is longer, in two phases, so that no task running on another
// worker is redelivered for it. First it announces to in each consumer's
// metadata; every worker re-reads it within AckWaitRefresh and heartbeats
// against the lower value from then on. After twice the longest re-read
// period plus a heartbeat period of the longest old value, no running task
// is paced for an old deadline any more, and the AckWait itself is lowered
// — on each consumer whose announcement is still this one (another process
// may have changed the consumer meanwhile; it is then left as it is). A
// repeat call finds nothing to lower.
func (a *Assets) LowerAckWait(ctx context.Context, consumers []natsjs.Consumer, to time.Duration, log func(msg string, kv ...any)) error {
	var (
		announced []natsjs.Consumer
		grace     time.Duration
	)
	for _, c := range consumers {
		info, err := c.Info(ctx)
		if err != nil {
			return fmt.Errorf("jetflow: lower AckWait: %w", err)
		}
		cfg := info.Config
		if cfg.AckWait <= to && cfg.Metadata[LoweringMetadata] == "" {
			continue
		}
		meta := make(map[string]string, len(cfg.Metadata)+1)
		for k, v := range cfg.Metadata {
			meta[k] = v
		}
		meta[LoweringMetadata] = to.String()
		cfg.Metadata = meta
		if _, err := a.JS.UpdateConsumer(ctx, info.Stream, cfg); err != nil {
			return fmt.Errorf("jetflow: consumer %s: announce AckWait %s: %w", info.Name, to, err)
		}
		announced = append(announced, c)
		grace = max(grace, 2*AckWaitRefresh(info.Config.AckWait)+info.Config.AckWait/3)
	}
	if len(announced) == 0 {
		return nil
	}
	log("lowering AckWait: announced, waiting for workers to follow",
		"consumers", len(announced), "ack_wait", to.String(), "grace", logging.Duration(grace))
	select {
	case <-ctx.Done():
		return fmt.Errorf("jetflow: lower AckWait (announced, not applied): %w", ctx.Err())
	case <-time.After(grace):
	}
	for _, c := range announced {
		info, err := c.Info(ctx)
		if err != nil {
			return fmt.Errorf("jetflow: lower AckWait: %w", err)
		}
		cfg := info.Config
		if cfg.Metadata[LoweringMetadata] != to.String() {
			log("consumer changed while its AckWait was being lowered; left as it is",
				"consumer", info.Name, "ack_wait", cfg.AckWait.String())
			continue
		}
		cfg.AckWait = to
		delete(cfg.Metadata, LoweringMetadata)
		if _, err := a.JS.UpdateConsumer(ctx, info.Stream, cfg); err != nil {
			return fmt.Errorf("jetflow: consumer %s: lower AckWait to %s: %w", info.Name, to, err)
		}
	}
	log("AckWait lowered", "consumers", len(announced), "ack_wait", to.String())
	return nil
}

func (cc ConsumerConfig) log(msg string, kv ...any) {
	if cc.Log != nil {
		cc.Log(msg, kv...)
	}
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

// executorSubjects are the subjects of the streams whose subjects changed
// with the lease executor: this version's, and the earlier version's kept
// for its workers.
var executorSubjects = map[string][]string{
	TasksStream:  {RunSubjects, BranchSubjects, LegacyTaskSubjects},
	TimersStream: {timerSubjects, fireSubjects, legacyTimerSubjects, legacyDueSubjects},
}

// RestoreSubjects adds back to the task and timer streams the subjects of
// this version that their configuration lacks, keeping every subject it
// has, and returns what it added ("<stream> <subject>"). An earlier
// version's worker provisions these streams with its own subjects only
// when it starts, which would leave this version's tasks nowhere to go: a
// worker of this version calls RestoreSubjects periodically while both run
// side by side. A repeat call adds nothing.
func (a *Assets) RestoreSubjects(ctx context.Context) ([]string, error) {
	var added []string
	for _, name := range []string{TasksStream, TimersStream} {
		s, err := a.JS.Stream(ctx, name)
		if err != nil {
			return added, fmt.Errorf("jetflow: read stream %s: %w", name, err)
		}
		cfg := s.CachedInfo().Config
		var missing []string
		for _, subj := range executorSubjects[name] {
			if !slices.Contains(cfg.Subjects, subj) {
				missing = append(missing, subj)
			}
		}
		if len(missing) == 0 {
			continue
		}
		cfg.Subjects = append(cfg.Subjects, missing...)
		if _, err := a.JS.UpdateStream(ctx, cfg); err != nil {
			return added, fmt.Errorf("jetflow: add subjects %v to stream %s: %w", missing, name, err)
		}
		for _, subj := range missing {
			added = append(added, name+" "+subj)
		}
	}
	return added, nil
}

// LookupWorkflows binds the deployment's workflows bucket (WorkflowsBucket)
// without creating or changing anything: nil when the deployment has none
// yet (no worker of it ever started). A worker reads the roster through it
// before it provisions anything (the engine protocol's gate).
func LookupWorkflows(ctx context.Context, nc *nats.Conn, topo Topology) (*KV, error) {
	topo = TopologyWithDefaults(topo)
	js, err := natsjs.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, WorkflowsBucket)
	if errors.Is(err, natsjs.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, Unavailable(err)
	}
	return newKV(js, kv, topo.Replicas, newDirectMux(nc)), nil
}
