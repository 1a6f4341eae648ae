package jetflow

import (
	"fmt"

	"github.com/jetflow/jetflow/internal/jetstream"
	"github.com/jetflow/jetflow/internal/sweep"
)

// sweepConfig is the sweeper setting of c, defaults filled in.
func (c WorkerConfig) sweepConfig() sweep.Config {
	return sweep.Config{AckWait: c.AckWait, Interval: c.SweepInterval, StuckAfter: c.StuckAfter}.WithDefaults()
}

// validateSweep names the bad sweeper field of c, if any.
func (c WorkerConfig) validateSweep() error {
	if c.SweepInterval < 0 {
		return nil // no sweeper
	}
	if err := c.sweepConfig().Validate(); err != nil {
		return fmt.Errorf("jetflow: worker config: %w", err)
	}
	return nil
}

// newSweeper returns the worker's sweeper over assets, looking after the
// runs of the workflows it serves; nil when SweepInterval is negative.
func (w *Worker) newSweeper(assets *jetstream.Assets) (*sweep.Sweeper, error) {
	if w.cfg.SweepInterval < 0 {
		return nil, nil
	}
	sc := w.cfg.sweepConfig()
	sc.Assets, sc.Workflows, sc.Logger = assets, w.ws.Names(), w.log
	sc.Metrics, sc.AfterPass, sc.Build = w.cfg.Metrics.internal(), w.cfg.sweepHook, w.cfg.Build
	return sweep.New(sc)
}

// startSweeper starts s's passes (none when s is nil); stop waits for them
// to end.
func startSweeper(s *sweep.Sweeper) (stop func()) {
	if s == nil {
		return func() {}
	}
	return s.Start()
}
