package opcluster

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
	"github.com/jetflow/jetflow/internal/testsupport/testenv"
)

// Check is the scenario's judge, so it must see what it is there to see:
// an accepted start without a run (lost), two "created" answers for one
// run ID and an order charged a second time under another key (doubled),
// and nothing on a clean run.
func TestCheckSeesLostAndDoubledWork(t *testing.T) {
	t.Parallel()
	srv := testenv.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pay, err := orders.StartPaymentService(orders.PaymentOptions{Log: testenv.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pay.Close() })

	reg := jetflow.NewRegistry()
	wf := orders.NewOrderWorkflow(orders.NewPaymentClient(pay.URL(), nil), orders.OrderOptions{})
	require.NoError(t, reg.Register(wf))
	w, err := jetflow.NewWorker(testenv.Conn(t, srv), reg, jetflow.WorkerConfig{Logger: testenv.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	c, err := jetflow.NewClient(ctx, testenv.Conn(t, srv), jetflow.ClientConfig{})
	require.NoError(t, err)

	clean := faultcheck.NewLedger()
	for _, id := range []string{"ok-1", "ok-2"} {
		_, err := c.StartByName(ctx, orders.WorkflowName, orderInput(id), jetflow.WithRunID(id))
		require.NoError(t, err)
		clean.Accepted(id, true)
		_, err = c.WaitRun(ctx, id)
		require.NoError(t, err)
	}
	v := Check(ctx, c, pay, clean)
	require.True(t, v.OK(), v.String())
	require.Equal(t, Verdict{Starts: 2, Runs: 2, Completed: 2, CommittedSteps: 2 * orders.StepCount, Charges: 2, ChargeRequests: 2}, v)

	bad := faultcheck.NewLedger()
	bad.Accepted("ok-1", true) // told "created" twice
	bad.Accepted("ok-1", true)
	bad.Accepted("ghost", true)
	// ok-2 charged again under a key no step of it has.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pay.URL()+"/charges",
		bytes.NewReader([]byte(`{"order_id":"ok-2","amount_cents":1999,"currency":"usd"}`)))
	require.NoError(t, err)
	req.Header.Set(orders.HeaderIdempotencyKey, "ok-2.charge.1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	bad.Accepted("ok-2", true)

	v = Check(ctx, c, pay, bad) // ghost: ErrRunNotFound at once
	t.Log(v)
	require.False(t, v.OK())
	require.Equal(t, 1, v.Lost, "ghost")
	require.Equal(t, 2, v.Doubled, "ok-1 created twice, ok-2 charged twice")
}
