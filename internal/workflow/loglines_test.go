package workflow

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// lines is a zerolog writer that keeps every line, safe for the
// executor's goroutines.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, string(p))
	return len(p), nil
}

func (l *lines) with(msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.all {
		if strings.Contains(s, `"message":"`+msg+`"`) {
			out = append(out, s)
		}
	}
	return out
}

// A line about a step names it once: a branch task's delivery logs its
// retry with one step_id, not the delivery's and the step's.
func TestStepLinesNameTheirStepOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, time.Second)
	hk := newHooked()
	logged := &lines{}
	var calls atomic.Int32
	e := r.executor("w1", fanOut(failing(&calls, retryIn(time.Hour)), ok(`"y"`)), func(c *Config) {
		hk.install(c)
		c.Logger = zerolog.New(logged)
	})
	r.serveCounted(e, 2, true, true)
	r.start("r", `{}`)
	r.eventually(func() bool { return len(logged.with("step failed; retrying")) == 1 }, "no retry line")
	line := logged.with("step failed; retrying")[0]
	require.Equal(t, 1, strings.Count(line, `"step_id":`), line)
	require.Contains(t, line, `"step_id":"r.x.0"`)

	r.serveTimers()
	require.Equal(t, 1, r.fireDue(time.Hour))
	r.wait("r")
}
