package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/httpapi"
	"github.com/jetflow/jetflow/internal/server/opshttp"
)

// The http phase measures starts through the HTTP API (producer serve's
// POST /v1/workflows/{name}/runs with an Idempotency-Key) from a loopback
// client, next to the same starts made with the Go SDK's StartByName, which
// is what the HTTP handler calls: both go by request-reply to a worker that
// admits them. The difference is the HTTP layer's cost. The admit phase's
// jetflow.Start (admission in the caller's process) and the raw KV create
// rate of the same run are the further references.
//
// One worker serves a workflow without steps, so that executing the runs
// started costs little next to admitting them.

// httpFigures is one repetition of the phase, in starts/s.
type httpFigures struct {
	sdkDistinct, sdkDup, httpDistinct, httpDup float64
}

// httpResults collects the repetitions; printHTTPReport prints them.
var httpResults []httpFigures

var httpWorkflow = jetflow.NewWorkflow("bench_http", func(_ *jetflow.Context, in int) (int, error) { return in, nil })

func engineHTTP(ctx context.Context, e *env, cfg config, rep int) (f httpFigures, err error) {
	wnc, err := e.conn("http-worker")
	if err != nil {
		return f, err
	}
	ws := jetflow.NewRegistry()
	if err := ws.Register(httpWorkflow); err != nil {
		return f, err
	}
	w, err := jetflow.NewWorker(wnc, ws, jetflow.WorkerConfig{Concurrency: cfg.concurrency})
	if err != nil {
		return f, err
	}
	if err := w.Start(ctx); err != nil {
		return f, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		err = errors.Join(err, w.Stop(sctx))
	}()

	cnc, err := e.conn("http-client")
	if err != nil {
		return f, err
	}
	client, err := jetflow.NewClient(ctx, cnc, jetflow.ClientConfig{Name: "bench"})
	if err != nil {
		return f, err
	}
	api, err := httpapi.New(httpapi.Config{Backend: client})
	if err != nil {
		return f, err
	}
	ln, err := opshttp.Listen("127.0.0.1:0")
	if err != nil {
		return f, err
	}
	// Served as producer serve serves it: under /v1/ of a mux, by the
	// commands' one http.Server (opshttp.NewServer: its timeouts, its
	// graceful shutdown).
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	serveCtx, stopServe := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- opshttp.Serve(serveCtx, ln, mux) }()
	defer func() {
		stopServe()
		err = errors.Join(err, <-served)
	}()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.admitG, MaxConnsPerHost: cfg.admitG}}
	defer hc.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/v1/workflows/" + httpWorkflow.Name() + "/runs"

	sdk := func(dup bool) func(ctx context.Context, i int) error {
		return func(ctx context.Context, i int) error {
			id := "bhs-" + strconv.Itoa(rep) + "-" + strconv.Itoa(i)
			res, err := client.StartByName(ctx, httpWorkflow.Name(), json.RawMessage(strconv.Itoa(i)), jetflow.WithRunID(id))
			if err != nil {
				return fmt.Errorf("StartByName %s: %w", id, err)
			}
			if want := map[bool]jetflow.Outcome{false: jetflow.OutcomeCreated, true: jetflow.OutcomeExisting}[dup]; res.Outcome != want {
				return fmt.Errorf("StartByName %s: outcome %s, want %s", id, res.Outcome, want)
			}
			return nil
		}
	}
	post := func(dup bool) func(ctx context.Context, i int) error {
		return func(ctx context.Context, i int) error {
			id := "bhh-" + strconv.Itoa(rep) + "-" + strconv.Itoa(i)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(strconv.Itoa(i))))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", id)
			resp, err := hc.Do(req)
			if err != nil {
				return fmt.Errorf("POST %s: %w", id, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return fmt.Errorf("POST %s: %w", id, err)
			}
			replayed := resp.Header.Get("Idempotent-Replayed") == "true"
			if resp.StatusCode != http.StatusCreated || replayed != dup {
				return fmt.Errorf("POST %s: %s (replayed %t, want %t): %s", id, resp.Status, replayed, dup, body)
			}
			return nil
		}
	}
	for _, m := range []struct {
		name string
		fn   func(bool) func(context.Context, int) error
		dst  [2]*float64
	}{
		{"SDK", sdk, [2]*float64{&f.sdkDistinct, &f.sdkDup}},
		{"HTTP", post, [2]*float64{&f.httpDistinct, &f.httpDup}},
	} {
		for j, dup := range []bool{false, true} {
			elapsed, err := parallel(ctx, cfg.admitN, cfg.admitG, m.fn(dup))
			if err != nil {
				return f, fmt.Errorf("%s (duplicates %t): %w", m.name, dup, err)
			}
			*m.dst[j] = float64(cfg.admitN) / elapsed.Seconds()
		}
	}
	return f, nil
}

// printHTTPReport prints the HTTP start figures next to StartByName's, the
// admit phase's jetflow.Start and the raw KV create rate of the same run.
func printHTTPReport(out io.Writer, r *results) {
	if len(httpResults) == 0 {
		return
	}
	pick := func(f func(httpFigures) float64) float64 {
		xs := make([]float64, len(httpResults))
		for i, x := range httpResults {
			xs[i] = f(x)
		}
		return median(xs)
	}
	sd, sdup := pick(func(x httpFigures) float64 { return x.sdkDistinct }), pick(func(x httpFigures) float64 { return x.sdkDup })
	hd, hdup := pick(func(x httpFigures) float64 { return x.httpDistinct }), pick(func(x httpFigures) float64 { return x.httpDup })
	kv, ad, adup := median(r.kvRates), median(r.admitDistinct), median(r.admitDup)
	rows := [][4]string{
		{"HTTP start, distinct keys, starts/s", num(hd), "SDK StartByName " + num(sd), ratio(hd, sd)},
		{"HTTP start, duplicate keys (replays), starts/s", num(hdup), "SDK StartByName " + num(sdup), ratio(hdup, sdup)},
	}
	if ad > 0 {
		rows = append(rows,
			[4]string{"HTTP start, distinct keys, starts/s", num(hd), "SDK jetflow.Start " + num(ad), ratio(hd, ad)},
			[4]string{"HTTP start, duplicate keys, starts/s", num(hdup), "SDK jetflow.Start " + num(adup), ratio(hdup, adup)})
	}
	if kv > 0 {
		rows = append(rows, [4]string{"HTTP start, distinct keys, starts/s", num(hd), "raw KV create " + strconv.Itoa(r.cfg.kvG) + "g " + num(kv), ratio(hd, kv)})
	}
	w := [3]int{len("metric"), len("jetflow"), len("reference")}
	for _, rw := range rows {
		w[0], w[1], w[2] = max(w[0], len(rw[0])), max(w[1], len(rw[1])), max(w[2], len(rw[2]))
	}
	fmt.Fprintf(out, "HTTP API: %s keys x %d loopback client goroutines, each started twice; one worker admits (request-reply)\n",
		num(float64(r.cfg.admitN)), r.cfg.admitG)
	fmt.Fprintf(out, "%-*s | %*s | %-*s | %s\n", w[0], "metric", w[1], "jetflow", w[2], "reference", "ratio")
	fmt.Fprintf(out, "%s-+-%s-+-%s-+-%s\n", strings.Repeat("-", w[0]), strings.Repeat("-", w[1]), strings.Repeat("-", w[2]), strings.Repeat("-", 5))
	for _, rw := range rows {
		fmt.Fprintf(out, "%-*s | %*s | %-*s | %s\n", w[0], rw[0], w[1], rw[1], w[2], rw[2], rw[3])
	}
	fmt.Fprintln(out)
}
