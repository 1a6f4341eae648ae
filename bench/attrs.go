package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/state"
)

// The attrs phase measures runs found by their attributes
// (jetflow.WithAttributes, ListOptions.Attributes) among many kept runs:
//
//   - populate: --index-runs run records with attributes written through
//     runs.Store (record, its entry, and an entry per attribute), the
//     index phase's mix of workflows and states. Run i has a customer
//     (one of attrCustomers) and an order_id: "42" for one run in
//     attrShare (5%), its own for the others.
//   - pages: ListRuns by one attribute (0.1% and 5% of the runs), by an
//     attribute and a status, by two attributes, and a deep page, each
//     repeated --index-samples times (p50/p99).
//   - cost: attrStarts starts without attributes, then as many with two,
//     one after the other (the latency a caller sees).
const (
	attrCustomers = 1000
	attrShare     = 20
	attrStarts    = 1000
)

// attrsOf is run i's attributes in the attrs phase.
func attrsOf(i int) map[string]string {
	order := "o-" + strconv.Itoa(i)
	if i%attrShare == 0 {
		order = "42"
	}
	return map[string]string{"customer": "c-" + strconv.Itoa(i%attrCustomers), "order_id": order}
}

type attrFigures struct {
	n                      int
	populate               time.Duration
	plainStart, attrsStart time.Duration // mean latency of one start
	pages                  []pageFigure
}

var attrResults []attrFigures

// engineAttrs is the attrs phase.
func engineAttrs(ctx context.Context, e *env, cfg config) (f attrFigures, err error) {
	f = attrFigures{n: cfg.indexRuns}
	plan := newIndexPlan(cfg.indexRuns)
	b, err := newIndexBench(ctx, e, "attrs")
	if err != nil {
		return f, err
	}
	store, client := b.store, b.client
	if f.populate, _, err = b.populate(ctx, cfg, plan, func(i int, now time.Time) state.Run {
		run := plan.record(i, now)
		run.RunID, run.Attributes = "attr-"+strconv.Itoa(i), attrsOf(i)
		return run
	}); err != nil {
		return f, err
	}
	if f.plainStart, f.attrsStart, err = startCost(ctx, client); err != nil {
		return f, err
	}
	has := func(want map[string]string) func(jetflow.Run) bool {
		return func(r jetflow.Run) bool { return state.HasAttributes(r.Attributes, want) }
	}
	shared := map[string]string{"order_id": "42"}
	lists := []struct {
		name  string
		opts  jetflow.ListOptions
		match func(jetflow.Run) bool
	}{
		{"attribute customer=c-7 (0.1%)", jetflow.ListOptions{Attributes: map[string]string{"customer": "c-7"}}, has(map[string]string{"customer": "c-7"})},
		{"attribute order_id=42 (5%)", jetflow.ListOptions{Attributes: shared}, has(shared)},
		{"attribute order_id=42 and status failed", jetflow.ListOptions{Attributes: shared, Status: jetflow.StatusFailed},
			func(r jetflow.Run) bool { return has(shared)(r) && r.Status == jetflow.StatusFailed }},
		{"attributes order_id=42 and customer=c-0", jetflow.ListOptions{Attributes: map[string]string{"order_id": "42", "customer": "c-0"}},
			has(map[string]string{"order_id": "42", "customer": "c-0"})},
	}
	for _, l := range lists {
		l.opts.Limit = indexPageSize
		p, err := measurePage(ctx, client, store.Index(), l.name, l.opts, cfg.indexSamples, l.match)
		if err != nil {
			return f, err
		}
		f.pages = append(f.pages, p)
	}
	cursor := ""
	depth := 1
	for ; depth < indexDeepPages; depth++ {
		page, err := client.ListRuns(ctx, jetflow.ListOptions{Attributes: shared, After: cursor, Limit: indexPageSize})
		if err != nil {
			return f, err
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	p, err := measurePage(ctx, client, store.Index(), fmt.Sprintf("deep: page %d of order_id=42", depth),
		jetflow.ListOptions{Attributes: shared, After: cursor, Limit: indexPageSize}, cfg.indexSamples, has(shared))
	if err != nil {
		return f, err
	}
	f.pages = append(f.pages, p)
	return f, nil
}

// startCost is the mean latency of a start (no worker runs it) without
// attributes and with two.
func startCost(ctx context.Context, c *jetflow.Client) (plain, attrs time.Duration, err error) {
	wf := jetflow.NewWorkflow("bench_attrs_start", func(ctx *jetflow.Context, in int) (int, error) { return in, nil })
	measure := func(prefix string, opts func(i int) []jetflow.StartOption) (time.Duration, error) {
		t := time.Now()
		for i := range attrStarts {
			if _, err := jetflow.Start(ctx, c, wf, i, append(opts(i), jetflow.WithRunID(prefix+strconv.Itoa(i)))...); err != nil {
				return 0, fmt.Errorf("start cost: %w", err)
			}
		}
		return time.Since(t) / attrStarts, nil
	}
	if plain, err = measure("cost-plain-", func(int) []jetflow.StartOption { return nil }); err != nil {
		return 0, 0, err
	}
	// Two attributes of the same sizes as the pages', under other names,
	// so that the pages measure the populate's runs alone.
	attrs, err = measure("cost-attrs-", func(i int) []jetflow.StartOption {
		a := attrsOf(i)
		return []jetflow.StartOption{jetflow.WithAttributes(map[string]string{"account": a["customer"], "order_ref": a["order_id"]})}
	})
	return plain, attrs, err
}

// printAttrsReport prints the attrs phase's figures.
func printAttrsReport(out io.Writer) {
	if len(attrResults) == 0 {
		return
	}
	f := attrResults[len(attrResults)-1]
	fmt.Fprintf(out, "attrs: %s kept runs with 2 attributes each (customer: 1 of %d; order_id: \"42\" for 1 in %d), written by runs.Store; pages of %d\n",
		num(float64(f.n)), attrCustomers, attrShare, indexPageSize)
	rows := [][4]string{
		{"populate runs/s (record + index entry + 2 attribute entries)", num(float64(f.n) / f.populate.Seconds()), "", ""},
		{"one start, mean ms: without attributes / with 2", ms(f.plainStart) + " / " + ms(f.attrsStart), "", ratio(float64(f.attrsStart), float64(f.plainStart))},
	}
	var missed []string
	for _, p := range f.pages {
		rows = append(rows, [4]string{fmt.Sprintf("%s (%s runs): p50 / p99 ms", p.name, num(float64(p.runs))),
			ms(p.full.p50) + " / " + ms(p.full.p99), "index page alone " + ms(p.index.p50) + " / " + ms(p.index.p99), ""})
		if p.full.p99 >= indexTarget {
			missed = append(missed, p.name)
		}
	}
	printTable(out, [4]string{"metric", "jetflow", "reference", "ratio"}, rows)
	if len(missed) == 0 {
		fmt.Fprintf(out, "attrs: every page within the %s target at p99\n", indexTarget)
	} else {
		fmt.Fprintf(out, "attrs: p99 at or over the %s target: %v\n", indexTarget, missed)
	}
	fmt.Fprintln(out)
}
