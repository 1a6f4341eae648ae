package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/testenv"
)

func TestMain(m *testing.M) { testenv.VerifyNoLeaks(m) }

// TestServe runs the worker as main wires it — embedded server, payment
// service, order workflow with a lost first charge response — takes a
// webhook delivered twice through it, and stops it as a signal would.
func TestServe(t *testing.T) {
	t.Parallel()
	cfg, err := parseConfig([]string{"--data-dir", t.TempDir(), "--port", "-1", "--flaky-charge"}, env(nil), false, nil)
	require.NoError(t, err)

	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	ready := make(chan endpoints, 1)
	served := make(chan error, 1)
	go func() {
		log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
		served <- serve(ctx, cfg, log, func(e endpoints) { ready <- e })
	}()
	var ep endpoints
	select {
	case ep = <-ready:
	case err := <-served:
		t.Fatalf("serve returned before ready: %v", err)
	}

	nc, err := jetstream.Connect(ep.NatsURL, t.Name())
	require.NoError(t, err)
	defer nc.Close()
	c, err := jetflow.NewClient(ctx, nc, jetflow.ClientConfig{})
	require.NoError(t, err)
	input := json.RawMessage(`{"order_id":"o-1","amount_cents":1999,"currency":"usd","email":"ada@example.com"}`)
	for _, want := range []jetflow.Outcome{jetflow.OutcomeCreated, jetflow.OutcomeExisting} {
		res, err := c.StartByName(ctx, "order", input, jetflow.WithRunID("stripe-evt_123"))
		require.NoError(t, err)
		require.Equal(t, want, res.Outcome)
	}
	run, err := c.WaitRun(ctx, "stripe-evt_123")
	require.NoError(t, err)
	require.Equal(t, jetflow.StatusCompleted, run.Status)

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.PaymentsURL+"/charges", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var charges struct {
		Charges int `json:"charges"`
		Data    []struct {
			IdempotencyKey string `json:"idempotency_key"`
			Requests       int    `json:"requests"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&charges))
	require.Equal(t, 1, charges.Charges)
	require.Equal(t, "stripe-evt_123.charge.0", charges.Data[0].IdempotencyKey)
	require.Equal(t, 2, charges.Data[0].Requests)

	stop() // as SIGTERM does
	require.NoError(t, <-served)
}
