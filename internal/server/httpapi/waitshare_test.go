package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// waitShareCheck is the check period of the client's shared watch of the
// runs bucket, as docs/operations.md documents it ("every 5 s"; the watch
// "stops 5 to 10 s after the last wait returned"). The allowances of the
// long-poll test derive from it.
const waitShareCheck = 5 * time.Second

// Hundreds of concurrent long-polls GET /v1/runs/{id}/result?wait= on one
// API server, on different runs and many on the same run, cost the NATS
// server one consumer on the runs bucket while they wait; an unknown run ID
// gets 404 well within a check period meanwhile; callers that go away
// midway disturb none of the others; every remaining long-poll answers
// 200 with its own run's final state once the run ends, and the consumer
// goes away within two check periods after the last answer.
func TestWaitShareLongPollsShareOneConsumer(t *testing.T) {
	t.Parallel()
	ns := testenv.Server(t)
	gate := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	// "gated" blocks until gate closes and returns its input doubled.
	gated := jetflow.NewWorkflow("gated", func(ctx *jetflow.Context, in int) (int, error) {
		return jetflow.Step(ctx, "hold", func(sctx context.Context) (int, error) {
			select {
			case <-gate:
				return in * 2, nil
			case <-sctx.Done():
				return 0, sctx.Err()
			}
		})
	})
	ws := jetflow.NewRegistry()
	require.NoError(t, ws.Register(gated))
	// No sweeper: its passes watch the runs bucket with consumers of their own.
	runWorker(t, ns, ws, jetflow.WorkerConfig{SweepInterval: -1, Concurrency: 64})
	client, err := jetflow.NewClient(ctxT(t, 10*time.Second), testenv.Conn(t, ns), jetflow.ClientConfig{})
	require.NoError(t, err)
	api, err := New(Config{Backend: client, Logger: testenv.Logger(t)})
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	js, err := natsjs.New(testenv.Conn(t, ns))
	require.NoError(t, err)
	consumers := func() (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), waitShareCheck)
		defer cancel()
		s, err := js.Stream(ctx, "KV_"+jetstream.RunsBucket)
		if err != nil {
			return 0, err
		}
		return s.CachedInfo().State.Consumers, nil
	}

	const runsN, perRun, onOne = 100, 3, 100 // 400 long-polls
	for i := range runsN {
		_, err := jetflow.Start(ctxT(t, 10*time.Second), client, gated, i, jetflow.WithRunID(fmt.Sprintf("lp-%d", i)))
		require.NoError(t, err)
	}
	n, err := consumers()
	require.NoError(t, err)
	require.Zero(t, n, "no watch before anybody waits")

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: runsN * perRun}}
	t.Cleanup(hc.CloseIdleConnections)
	// poll long-polls the result of runID and returns the status and run.
	poll := func(ctx context.Context, runID string) (int, jetflow.Run, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			srv.URL+"/v1/runs/"+runID+"/result?wait="+MaxWait.String(), nil)
		if err != nil {
			return 0, jetflow.Run{}, err
		}
		res, err := hc.Do(req)
		if err != nil {
			return 0, jetflow.Run{}, err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return 0, jetflow.Run{}, err
		}
		var run jetflow.Run
		if res.StatusCode == http.StatusOK {
			err = json.Unmarshal(body, &run)
		}
		return res.StatusCode, run, err
	}
	ctx := ctxT(t, MaxWait)
	errs := make(chan error, runsN*perRun+onOne)
	var wg sync.WaitGroup
	check := func(id string, in int) {
		defer wg.Done()
		code, run, err := poll(ctx, id)
		if err == nil && (code != http.StatusOK || run.RunID != id || run.Status != jetflow.StatusCompleted || string(run.Output) != fmt.Sprint(2*in)) {
			err = fmt.Errorf("long-poll of %s: %d %s %s output %s", id, code, run.RunID, run.Status, run.Output)
		}
		errs <- err
	}
	for i := range runsN {
		for range perRun {
			wg.Add(1)
			go check(fmt.Sprintf("lp-%d", i), i)
		}
	}
	for range onOne {
		wg.Add(1)
		go check("lp-0", 0)
	}
	// Callers that go away midway: one per run, cancelled below.
	gone, leave := context.WithCancel(ctx)
	defer leave()
	left := make(chan error, runsN)
	for i := range runsN {
		go func() {
			code, run, err := poll(gone, fmt.Sprintf("lp-%d", i))
			if err == nil {
				err = fmt.Errorf("a long-poll whose caller went away answered %d %s", code, run.Status)
			}
			left <- err
		}()
	}

	// The shared watch shows up within a check period; while the polls
	// wait there is never more than one.
	deadline := time.Now().Add(waitShareCheck)
	for {
		n, err := consumers()
		require.NoError(t, err)
		require.LessOrEqual(t, n, 1, "long-polls of one API server must share one consumer")
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no watch of the runs bucket while long-polls wait")
	}
	began := time.Now()
	code, _, err := poll(ctxT(t, waitShareCheck), "lp-unknown")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code)
	require.Less(t, time.Since(began), waitShareCheck, "404 must not wait for a check")
	select {
	case err := <-errs:
		t.Fatalf("a long-poll answered before its run ended: %v", err)
	default:
	}
	leave()
	for range runsN {
		select {
		case err := <-left:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(waitShareCheck):
			t.Fatal("a long-poll whose caller went away did not end within a check period")
		}
	}
	for range 20 { // sampled while every other poll still waits
		n, err := consumers()
		require.NoError(t, err)
		require.Equal(t, 1, n, "long-polls of one API server must share one consumer")
	}
	select {
	case err := <-errs:
		t.Fatalf("a long-poll answered before its run ended: %v", err)
	default:
	}

	released := time.Now()
	close(gate)
	for range runsN*perRun + onOne {
		require.NoError(t, <-errs)
	}
	t.Logf("%d long-polls answered %s after the runs' release", runsN*perRun+onOne, time.Since(released).Round(time.Millisecond))
	wg.Wait()
	require.Eventually(t, func() bool {
		n, err := consumers()
		return err == nil && n == 0
	}, 3*waitShareCheck, 50*time.Millisecond, "the shared watch outlived its last long-poll by more than 2 check periods")
}
