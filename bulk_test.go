package jetflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/internal/jetstream"
)

// A child worker in mode "bulk" serves bulk operations and bulkorder.
func init() {
	childExtras = append(childExtras, func(crash, effects string, _ *WorkerConfig) []Registrable {
		if crash != "bulk" {
			return nil
		}
		nc, err := jetstream.Connect(os.Getenv(childURLEnv), "child-bulk-client")
		if err != nil {
			panic(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := NewClient(ctx, nc, ClientConfig{Name: "bulk"})
		if err != nil {
			panic(err)
		}
		return []Registrable{BulkOperations(c), bulkOrder(effects)}
	})
}

// bulkOrder reports each step's side effect to the effect server; its
// third step, c, fails for good in a run that is not a rerun.
func bulkOrder(effects string) *Workflow[int, string] {
	return NewWorkflow("bulkorder", func(ctx *Context, _ int) (string, error) {
		for _, name := range []string{"a", "b", "c"} {
			_, err := Step(ctx, name, func(sctx context.Context) (string, error) {
				info, _ := StepDetailsFrom(sctx)
				if err := reportEffect(sctx, effects, info); err != nil {
					return "", err
				}
				if name == "c" && !strings.Contains(info.RunID, "-rerun") {
					return "", Fatal(errors.New("warehouse down"))
				}
				return name, nil
			})
			if err != nil {
				return "", err
			}
		}
		return "shipped", nil
	})
}

// Runs failed at their third step are rerun in bulk while worker
// processes are SIGKILLed one after another: every run is rerun exactly
// once, its first two steps never run again, the operation started again
// under its ID starts nothing twice, and its progress is exact.
func TestBulkRerunUnderKills(t *testing.T) {
	t.Parallel()
	const runs = 120
	env := newEnv(t, Topology{})
	effects, url := newEffectServer(t)
	c := env.client()
	ctx := ctxT(t, 4*time.Minute)

	first := []*exec.Cmd{startChild(t, env, "bulk", url), startChild(t, env, "bulk", url)}
	for _, w := range first {
		require.NoError(t, waitReady(w, 30*time.Second))
	}
	for i := range runs {
		_, err := c.StartByName(ctx, "bulkorder", json.RawMessage(`1`), WithRunID(fmt.Sprintf("bo-%d", i)))
		require.NoError(t, err)
	}
	for i := range runs {
		run, err := c.WaitRun(ctx, fmt.Sprintf("bo-%d", i))
		require.NoError(t, err)
		require.Equal(t, StatusFailed, run.Status)
	}
	before := map[string]int{}
	for i := range runs {
		for _, step := range []string{"a", "b"} {
			id := fmt.Sprintf("bo-%d.%s.0", i, step)
			before[id] = len(effects.get(id))
			require.Positive(t, before[id], id)
		}
	}
	for _, w := range first {
		require.NoError(t, w.Process.Signal(syscall.SIGKILL))
		_ = w.Wait()
	}

	// Worker processes are SIGKILLed, all of them, each time the
	// operation has done a few more reruns (and replaced); it is asked
	// for twice under its ID, and paced (a page, then a durable pause).
	children := []*exec.Cmd{startChild(t, env, "bulk", url), startChild(t, env, "bulk", url)}
	op := BulkRerun{Filter: BulkFilter{Workflow: "bulkorder"}, PerSecond: 200}
	require.Eventually(t, func() bool {
		_, err := c.StartBulkRerun(ctx, "op-1", op)
		return err == nil // no worker serves it until a child is up: retried
	}, time.Minute, 50*time.Millisecond)
	_, err := c.StartBulkRerun(ctx, "op-1", BulkRerun{Filter: BulkFilter{Workflow: "bulkorder", Status: StatusCancelled}})
	require.NoError(t, err, "a repeat under the operation's ID finds it")
	kills := 0 // of all workers while the operation was running
	for _, mark := range []int{15, 50, 105} {
		running := false
		require.Eventually(t, func() bool {
			p, err := c.BulkProgress(ctx, "op-1")
			running = err == nil && p.Status == StatusRunning
			return err == nil && (p.Done >= mark || !running)
		}, 2*time.Minute, 5*time.Millisecond)
		for i, w := range children {
			require.NoError(t, w.Process.Signal(syscall.SIGKILL))
			_ = w.Wait()
			children[i] = startChild(t, env, "bulk", url)
		}
		if running {
			kills++
		}
	}
	require.GreaterOrEqual(t, kills, 2, "the operation ended before the workers were killed twice")
	end, err := c.WaitRun(ctx, BulkRunID("op-1"))
	require.NoError(t, err)
	require.Equal(t, StatusCompleted, end.Status, "%+v", end.Error)
	t.Logf("times every worker was killed while the operation ran: %d", kills)

	p, err := c.BulkProgress(ctx, "op-1")
	require.NoError(t, err)
	require.Equal(t, runs, p.Listed)
	require.Equal(t, runs, p.Done)
	require.Zero(t, p.Remaining)
	require.True(t, p.ListingDone)
	require.Zero(t, p.Failed, "%+v", p.Errors)
	require.Equal(t, runs, p.Created+p.Existing)
	for i := range runs {
		src := fmt.Sprintf("bo-%d", i)
		rerun := src + "-rerun-c-0"
		run, err := c.WaitRun(ctx, rerun)
		require.NoError(t, err)
		require.Equal(t, StatusCompleted, run.Status, "%s: %+v", rerun, run.Error)
		source, err := c.GetRun(ctx, src)
		require.NoError(t, err)
		require.Len(t, source.Reruns, 1, "%s rerun more than once", src)
		for _, step := range []string{"a", "b"} {
			require.Equal(t, before[src+"."+step+".0"], len(effects.get(src+"."+step+".0")), "%s ran again", step)
			require.Empty(t, effects.get(rerun+"."+step+".0"), "the rerun ran %s", step)
		}
		require.NotEmpty(t, effects.get(rerun+".c.0"), "%s: c never ran", rerun)
	}
	page, err := c.ListRuns(ctx, ListOptions{Workflow: "bulkorder", Limit: MaxListLimit})
	require.NoError(t, err)
	require.Len(t, page.Runs, 2*runs, "a run was rerun twice")
}
