package opcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/examples/orders"
	"github.com/jetflow/jetflow/internal/testsupport/faultcheck"
)

// Producer starts order runs through the HTTP API of a `producer serve`
// process, as a service would.
type Producer struct {
	BaseURL string // http://host:port of producer serve
	HTTP    *http.Client
}

// orderInput is the input of run id: the same for every start of id, so
// a duplicate is a duplicate and not a conflict.
func orderInput(id string) []byte {
	b, _ := json.Marshal(orders.OrderInput{OrderID: id, AmountCents: 1999, Currency: "usd", Email: "ops@example.com"})
	return b
}

// errRetry is an answer a producer retries with the same run ID.
var errRetry = errors.New("retryable answer")

// start POSTs one start of run id. created is false when the API said the
// run existed (Idempotent-Replayed). A 503 or a connection error is
// errRetry; any other non-201 answer is an error of its own.
func (p Producer) start(ctx context.Context, id string) (created bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.BaseURL+"/v1/workflows/"+orders.WorkflowName+"/runs", bytes.NewReader(orderInput(id)))
	if err != nil {
		return false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", id)
	resp, err := p.HTTP.Do(req)
	if err != nil {
		return false, fmt.Errorf("%w: %v", errRetry, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch resp.StatusCode {
	case http.StatusCreated:
		return resp.Header.Get("Idempotent-Replayed") != "true", nil
	case http.StatusServiceUnavailable:
		return false, fmt.Errorf("%w: 503 %s", errRetry, bytes.TrimSpace(body))
	default:
		return false, fmt.Errorf("start %s: HTTP %d: %s", id, resp.StatusCode, bytes.TrimSpace(body))
	}
}

// StartUntilAccepted starts run id, retrying retryable answers until one
// is accepted or ctx ends, and records the outcome in l.
func (p Producer) StartUntilAccepted(ctx context.Context, l *faultcheck.Ledger, id string) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		created, err := p.start(actx, id)
		cancel()
		if err == nil {
			l.Accepted(id, created)
			return nil
		}
		if !errors.Is(err, errRetry) {
			return err
		}
		l.Failed()
		select {
		case <-ctx.Done():
			return fmt.Errorf("start %s: %w (last answer: %v)", id, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Plan is the start sequence of n runs prefix-0..n-1 in which every fourth
// start is a duplicate of a run started a few starts earlier: a quarter of
// the starts are duplicates.
func Plan(prefix string, n int) []string {
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("%s-%d", prefix, i))
		if i%3 == 2 {
			ids = append(ids, fmt.Sprintf("%s-%d", prefix, i-2))
		}
	}
	return ids
}

// Load starts ids in order, one every interval, from four concurrent
// senders, each start retried until accepted. It returns the first
// error that was not retryable, or ctx's.
func (p Producer) Load(ctx context.Context, l *faultcheck.Ledger, ids []string, every time.Duration) error {
	work := make(chan string)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				if err := p.StartUntilAccepted(ctx, l, id); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var err error
send:
	for _, id := range ids {
		select {
		case <-tick.C:
		case err = <-errs:
			break send
		}
		select {
		case work <- id:
		case err = <-errs:
			break send
		}
	}
	close(work) // senders still reading stop; one that failed already returned
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return err
}

// Verdict is what one phase left behind, read back from NATS and from the
// payment service.
type Verdict struct {
	Starts         int // accepted starts
	Retried        int // starts answered 503 (or not at all) and sent again
	Duplicates     int // accepted starts answered "existing"
	Runs           int // run IDs the producer was told about
	Completed      int
	CommittedSteps int
	Charges        int // charges the payment service made for the phase's orders
	ChargeRequests int // requests it received for them (a retried charge step sends its key again)
	Lost           int // a run missing, not completed, or completed without all its steps or its charge
	Doubled        int // a run created twice, an order charged twice, a charge step whose result is not the service's charge
	Problems       []string
}

// OK reports whether nothing was lost or doubled.
func (v Verdict) OK() bool { return v.Lost == 0 && v.Doubled == 0 && len(v.Problems) == 0 }

func (v Verdict) String() string {
	s := fmt.Sprintf("starts=%d (retried %d) duplicates=%d runs=%d completed=%d committed_steps=%d charges=%d charge_requests=%d lost=%d doubled=%d",
		v.Starts, v.Retried, v.Duplicates, v.Runs, v.Completed, v.CommittedSteps, v.Charges, v.ChargeRequests, v.Lost, v.Doubled)
	return s + faultcheck.ProblemList(v.Problems)
}

// Check waits (until ctx ends) for every run in l to end, then reads each
// run and its steps through c and compares the committed charge of each
// with pay's record, by order. Every order must have exactly one run,
// completed with the order workflow's steps (orders.StepCount), and exactly one charge,
// the one its charge step committed.
func Check(ctx context.Context, c *jetflow.Client, pay *orders.PaymentService, l *faultcheck.Ledger) Verdict {
	t := l.Tally()
	v := Verdict{Retried: t.Failed, Starts: t.Starts, Duplicates: t.Duplicates, Doubled: t.Doubled, Problems: t.Problems, Runs: len(t.RunIDs)}
	ids := t.RunIDs

	sorted := make([]string, 0, len(ids))
	for id := range ids {
		sorted = append(sorted, id)
	}
	sort.Strings(sorted)
	// Every run first: the charges are listed once no run can add one.
	runs := make(map[string]jetflow.Run, len(sorted))
	for _, id := range sorted {
		run, err := c.WaitRun(ctx, id)
		if err != nil {
			v.Lost++
			v.Problems = append(v.Problems, fmt.Sprintf("run %s: %v", id, err))
			continue
		}
		runs[id] = run
	}
	list, err := listCharges(ctx, pay.URL())
	if err != nil {
		v.Problems = append(v.Problems, err.Error())
	}
	byOrder := map[string][]orders.Charge{}
	for _, ch := range list {
		byOrder[ch.OrderID] = append(byOrder[ch.OrderID], ch)
	}
	for _, id := range sorted {
		if run, ok := runs[id]; ok {
			lost, doubled, problems := checkRun(ctx, c, run, byOrder[id], &v)
			v.Lost += lost
			v.Doubled += doubled
			v.Problems = append(v.Problems, problems...)
		}
	}
	return v
}

// checkRun checks one order: its ended run, its steps and its charges.
func checkRun(ctx context.Context, c *jetflow.Client, run jetflow.Run, charges []orders.Charge, v *Verdict) (lost, doubled int, problems []string) {
	id := run.RunID
	v.Charges += len(charges)
	for _, ch := range charges {
		v.ChargeRequests += ch.Requests
	}
	if len(charges) > 1 {
		doubled++
		problems = append(problems, fmt.Sprintf("order %s charged %d times: %+v", id, len(charges), charges))
	}
	if run.Status != jetflow.StatusCompleted {
		return lost + 1, doubled, append(problems, fmt.Sprintf("run %s ended %s: %+v", id, run.Status, run.Error))
	}
	v.Completed++
	steps, err := c.Steps(ctx, id)
	if err != nil {
		return lost + 1, doubled, append(problems, fmt.Sprintf("run %s steps: %v", id, err))
	}
	v.CommittedSteps += len(steps)
	if len(steps) != orders.StepCount {
		lost++
		problems = append(problems, fmt.Sprintf("run %s completed with %d committed steps, want %d", id, len(steps), orders.StepCount))
	}
	for _, s := range steps {
		if s.Name != orders.StepCharge {
			continue
		}
		var res orders.ChargeResult
		if err := json.Unmarshal(s.Output, &res); err != nil {
			return lost + 1, doubled, append(problems, fmt.Sprintf("step %s: undecodable result: %v", s.StepID, err))
		}
		switch {
		case len(charges) == 0:
			lost++
			problems = append(problems, fmt.Sprintf("step %s committed charge %s, which the payment service never made", s.StepID, res.ChargeID))
		case charges[0].ID != res.ChargeID || charges[0].IdempotencyKey != s.StepID:
			doubled++
			problems = append(problems, fmt.Sprintf("step %s committed charge %s (key %s), the service made %s under %s",
				s.StepID, res.ChargeID, res.IdempotencyKey, charges[0].ID, charges[0].IdempotencyKey))
		}
	}
	return lost, doubled, problems
}

// listCharges reads every charge the payment service at url made, with
// how many requests carried its key (GET /charges).
func listCharges(ctx context.Context, url string) ([]orders.Charge, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/charges", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("list charges: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Data []orders.Charge `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("list charges: HTTP %d: %w", resp.StatusCode, err)
	}
	return body.Data, nil
}
