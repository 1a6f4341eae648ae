package workermain

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/jetflow/jetflow"
	"github.com/jetflow/jetflow/internal/server/natsconn"
	"github.com/jetflow/jetflow/internal/server/timeline"
)

// checkCommand is the first argument that makes the command check the
// worker's code instead of serving it.
const checkCommand = "check"

// runCheck is the command "<worker> check": check, its report on stdout,
// and the exit code (ExitOK, ExitWouldBlock, ExitError).
func (p *program) runCheck(ctx context.Context, ws *jetflow.Registry, cfg config, log zerolog.Logger) int {
	report, err := p.checkCode(ctx, ws, cfg, log)
	if err == nil {
		err = report.write(p.stdout, cfg.Output == "json")
	}
	switch {
	case err != nil:
		log.Error().Err(err).Msg("check failed")
		return ExitError
	case !report.Clean():
		return ExitWouldBlock
	}
	return ExitOK
}

// checkCode connects to NATS as the worker would (without waiting for it:
// a check that cannot reach its deployment fails), runs the program's
// setup (which may add workflows to ws), refuses what jetflow.NewWorker
// refuses (an invalid --build, a pinned workflow without a build), and
// replays the code of ws against every run in flight of its workflows
// (jetflow.Client.CheckCode) with the build the worker would have. It
// creates no consumer, announces no worker and runs no step.
func (p *program) checkCode(ctx context.Context, ws *jetflow.Registry, cfg config, log zerolog.Logger) (checkReport, error) {
	nc, err := cfg.NATS.Connect("jetflow-"+p.name+"-check", append(natsconn.LogEvents(log), nats.Timeout(5*time.Second))...)
	if err != nil {
		return checkReport{}, err
	}
	defer nc.Close()
	if p.setup != nil {
		closeSetup, err := p.setup(ctx, Setup{Logger: log, Conn: nc})
		if err != nil {
			return checkReport{}, err
		}
		if closeSetup != nil {
			defer closeSetup()
		}
	}
	wcfg := jetflow.WorkerConfig{Build: cfg.Build, Logger: log, Topology: cfg.topology()}
	if _, err := jetflow.NewWorker(nc, ws, wcfg); err != nil {
		return checkReport{}, err
	}
	build := wcfg.WithDefaults().Build
	cctx, cancel := context.WithTimeout(ctx, startTimeout)
	c, err := jetflow.NewClient(cctx, nc, jetflow.ClientConfig{Name: p.name + "-check", Topology: wcfg.Topology})
	cancel()
	if err != nil {
		return checkReport{}, err
	}
	check, err := c.CheckCode(ctx, ws, build)
	if err != nil {
		return checkReport{}, err
	}
	return checkReport{Build: build, CodeCheck: check}, nil
}

// checkReport is what check prints: the build checked and CheckCode's
// report (as JSON: {"build", "checked", "blocked": [{"run_id",
// "workflow", "divergence"}]}).
type checkReport struct {
	Build string `json:"build"`
	jetflow.CodeCheck
}

// write prints r: as JSON, or as a line saying what was checked and, when
// the code would block runs, a table of them: run, workflow, the kind of
// divergence, the place, the history's step and the code's step there,
// and the detail.
func (r checkReport) write(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	build := "build " + timeline.Clean(r.Build)
	if r.Build == "" {
		build = "the code (no build identity)"
	}
	if r.Clean() {
		_, err := fmt.Fprintf(w, "%s replays every run in flight of its workflows: %d checked, none would be blocked\n", build, r.Checked)
		return err
	}
	if _, err := fmt.Fprintf(w, "%s would block %d of the %d runs in flight of its workflows:\n", build, len(r.Blocked), r.Checked); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN ID\tWORKFLOW\tDIVERGENCE\tPLACE\tHISTORY STEP\tCODE STEP\tDETAIL")
	for _, b := range r.Blocked {
		d := b.Divergence // CheckCode reports a run with its divergence
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", b.RunID, b.Workflow, timeline.Clean(string(d.Kind)), d.Position,
			timeline.Clean(d.History.String()), timeline.Clean(d.Code.String()), timeline.Clean(d.Detail))
	}
	return tw.Flush()
}
