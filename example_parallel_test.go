package jetflow_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jetflow/jetflow"
)

// Fan-out and fan-in: one step per image, started with Go, all running at
// once, then AwaitAll. The step IDs count the calls of "resize" in the
// order the body started them, whichever finished first: here the last
// one finishes before the first.
func ExampleGo() {
	lastDone := make(chan struct{})
	thumbnails := jetflow.NewWorkflow("thumbnails", func(ctx *jetflow.Context, album string) ([]string, error) {
		images, err := jetflow.Step(ctx, "list", func(context.Context) ([]string, error) {
			return []string{"a.jpg", "b.jpg", "c.jpg"}, nil
		})
		if err != nil {
			return nil, err
		}
		futures := make([]*jetflow.Future[string], len(images))
		for i, img := range images {
			futures[i] = jetflow.Go(ctx, "resize", func(sctx context.Context) (string, error) {
				switch i {
				case 0: // the first finishes after the last
					select {
					case <-lastDone:
					case <-sctx.Done():
						return "", sctx.Err()
					}
				case len(images) - 1:
					defer close(lastDone)
				}
				step, _ := jetflow.StepDetailsFrom(sctx)
				return step.StepID + " " + strings.TrimSuffix(img, ".jpg") + "-small.jpg", nil
			})
		}
		if err := jetflow.AwaitAll(ctx, futures[0], futures[1], futures[2]); err != nil {
			return nil, err
		}
		var out []string
		for _, f := range futures {
			s, err := f.Get(ctx) // committed: returns at once
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	})
	c, stop := exampleEnv(thumbnails)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	h, err := jetflow.Start(ctx, c, thumbnails, "holiday", jetflow.WithRunID("album-holiday"))
	if err != nil {
		panic(err)
	}
	out, err := h.Result(ctx)
	if err != nil {
		panic(err)
	}
	for _, s := range out {
		fmt.Println(s)
	}
	// Output:
	// album-holiday.resize.0 a-small.jpg
	// album-holiday.resize.1 b-small.jpg
	// album-holiday.resize.2 c-small.jpg
}

// Racing: ask two mirrors and take the first answer. The winner is the
// step whose result was committed first, and a replay picks it again.
// The loser is not waited for.
func ExampleAwaitFirst() {
	slowMirror := make(chan struct{})
	download := jetflow.NewWorkflow("download", func(ctx *jetflow.Context, file string) (string, error) {
		size, err := jetflow.Step(ctx, "stat", func(context.Context) (int, error) { return 1024, nil })
		if err != nil {
			return "", err
		}
		mirrors := []string{"eu", "us"}
		eu := jetflow.Go(ctx, "fetch", func(sctx context.Context) (string, error) {
			select { // this mirror is slow today
			case <-slowMirror:
				return "late", nil
			case <-sctx.Done():
				return "", sctx.Err()
			}
		})
		us := jetflow.Go(ctx, "fetch", func(context.Context) (string, error) {
			return fmt.Sprintf("%s (%d bytes)", file, size), nil
		})
		won, err := jetflow.AwaitFirst(ctx, eu, us)
		if err != nil {
			return "", err
		}
		got, err := []*jetflow.Future[string]{eu, us}[won].Get(ctx)
		if err != nil {
			return "", err
		}
		return mirrors[won] + ": " + got, nil
	})
	c, stop := exampleEnv(download)
	defer stop()
	defer close(slowMirror) // before stop: Stop waits for the running step
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	h, err := jetflow.Start(ctx, c, download, "iso", jetflow.WithRunID("download-iso"))
	if err != nil {
		panic(err)
	}
	out, err := h.Result(ctx)
	fmt.Println(out, err)
	// Output:
	// us: iso (1024 bytes) <nil>
}

type Shipment struct {
	OrderID string `json:"order_id"`
	Items   int    `json:"items"`
}

// A child workflow: the parent starts a run of another workflow as one of
// its steps and waits for its output. The child's run ID is derived from
// the parent's (<parent-run-id>=<workflow>=<occurrence>), so a replayed
// parent finds the same child; both runs link to each other.
func ExampleChild() {
	ship := jetflow.NewWorkflow("ship", func(ctx *jetflow.Context, s Shipment) (string, error) {
		return jetflow.Step(ctx, "book", func(context.Context) (string, error) {
			return fmt.Sprintf("parcel for %s with %d items", s.OrderID, s.Items), nil
		})
	})
	order := jetflow.NewWorkflow("order", func(ctx *jetflow.Context, id string) (string, error) {
		return jetflow.Child(ctx, ship, Shipment{OrderID: id, Items: 2}).Get(ctx)
	})
	c, stop := exampleEnv(order, ship)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	h, err := jetflow.Start(ctx, c, order, "o-7", jetflow.WithRunID("order-o-7"))
	if err != nil {
		panic(err)
	}
	out, err := h.Result(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(out)
	parent, err := c.GetRun(ctx, "order-o-7")
	if err != nil {
		panic(err)
	}
	for _, child := range parent.Children {
		fmt.Println("child:", child.RunID, child.Workflow, "step", child.StepID)
	}
	run, err := c.GetRun(ctx, "order-o-7=ship=0")
	if err != nil {
		panic(err)
	}
	fmt.Println("parent:", run.Parent.RunID, run.Status)
	// Output:
	// parcel for o-7 with 2 items
	// child: order-o-7=ship=0 ship step order-o-7.ship.0
	// parent: order-o-7 completed
}
