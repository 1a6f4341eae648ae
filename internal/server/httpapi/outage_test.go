package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
)

// outageRoutes are the requests the outage test keeps sending, by name:
// a start under a fresh key each time, a read, a result, a list and an
// event (the same one each time: delivered once, then duplicates).
var outageRoutes = []string{"start", "get", "result", "list", "event"}

// outageTally counts the answers of one route, by phase.
type outageTally struct {
	ok, unavailable atomic.Int64
}

// With NATS stopped in the middle of traffic, every route answers 503 with
// Retry-After (never 500), the Go client's errors match ErrUnavailable, and
// once NATS is back the same routes succeed again, the starts refused
// during the outage included when retried with their keys.
func TestNATSOutageIs503WithRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequestTimeout = 2 * time.Second })
	require.Equal(t, http.StatusCreated, b.post("echo", "before-1", `{"n":1}`).code)
	b.waitDone("before-1")
	// A run held before its wait: the event is kept, and every repeat of
	// it is a duplicate (200), never "run ended".
	require.Equal(t, http.StatusCreated, b.post("waiter", "wait-out", `{"block":true}`).code)

	var (
		phase   atomic.Int32 // 0 before the outage, 1 during, 2 after the restart
		tallies [3]map[string]*outageTally
		mu      sync.Mutex
		bad     []string
		refused []string // keys of starts answered 503
	)
	for i := range tallies {
		tallies[i] = map[string]*outageTally{}
		for _, r := range outageRoutes {
			tallies[i][r] = &outageTally{}
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, route := range outageRoutes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(5 * time.Millisecond) // paces the traffic
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				p := phase.Load()
				key := fmt.Sprintf("out-%d-%d", p, n)
				var res response
				switch route {
				case "start":
					res = b.post("echo", key, `{"n":2}`)
				case "get":
					res = b.do(http.MethodGet, "/v1/runs/before-1", nil, "")
				case "result":
					res = b.do(http.MethodGet, "/v1/runs/before-1/result", nil, "")
				case "list":
					res = b.do(http.MethodGet, "/v1/runs?limit=5", nil, "")
				case "event":
					res = b.event(sendPath("wait-out", "paid"), "pay-out", `{"ref":"out"}`)
				}
				tally := tallies[p][route]
				switch {
				case res.code == http.StatusServiceUnavailable && res.header.Get("Retry-After") != "":
					tally.unavailable.Add(1)
					if route == "start" {
						mu.Lock()
						refused = append(refused, key)
						mu.Unlock()
					}
				case res.code == http.StatusOK || res.code == http.StatusCreated:
					tally.ok.Add(1)
				default:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s in phase %d: %d %s %s", route, p, res.code, res.header.Get("Retry-After"), res.body))
					mu.Unlock()
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()

	// until reports whether every route has had want answers counted by
	// count in phase p.
	until := func(p int, what string, count func(*outageTally) int64) {
		t.Helper()
		require.Eventually(t, func() bool {
			for _, r := range outageRoutes {
				if count(tallies[p][r]) < 3 {
					return false
				}
			}
			return true
		}, 30*time.Second, 10*time.Millisecond, "not every route got %s in phase %d", what, p)
	}
	okCount := func(ta *outageTally) int64 { return ta.ok.Load() }
	until(0, "successes", okCount)

	phase.Store(1)
	b.ns.Shutdown()
	until(1, "503s", func(ta *outageTally) int64 { return ta.unavailable.Load() })

	// The Go client says the same, with a sentinel a caller can branch on.
	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := b.client.GetRun(cctx, "before-1")
	require.ErrorIs(t, err, jetflow.ErrUnavailable)
	_, err = b.client.StartByName(cctx, "echo", json.RawMessage(`{"n":3}`), jetflow.WithRunID("sdk-out-1"))
	require.ErrorIs(t, err, jetflow.ErrUnavailable)
	_, err = b.client.ListRuns(cctx, jetflow.ListOptions{})
	require.ErrorIs(t, err, jetflow.ErrUnavailable)
	_, err = b.client.Steps(cctx, "before-1")
	require.ErrorIs(t, err, jetflow.ErrUnavailable)
	_, err = b.client.SendEvent(cctx, "wait-out", "paid", "pay-out", json.RawMessage(`{"ref":"out"}`))
	require.ErrorIs(t, err, jetflow.ErrUnavailable)
	_, err = b.client.Resume(cctx, "some-token", "e-1", nil)
	require.ErrorIs(t, err, jetflow.ErrUnavailable)

	require.NoError(t, b.ns.Restart())
	phase.Store(2)
	until(2, "successes", okCount)
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, bad, "answers other than success or 503 with Retry-After")
	// A start refused during the outage, retried with its key, starts once.
	require.NotEmpty(t, refused)
	res := b.post("echo", refused[0], `{"n":2}`)
	require.Equal(t, http.StatusCreated, res.code, "body: %s", res.body)
	b.waitDone(refused[0])
	// The event, sent through the outage, was delivered once: the run
	// completes with it.
	b.release()
	var run jetflow.Run
	b.waitDone("wait-out").json(t, &run)
	require.JSONEq(t, `"out"`, string(run.Output))
	require.Equal(t, int64(1), b.afters.Load())
}
