package jetstream

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// FireDue fires the stored timers whose Jetflow-Due the given time has
// reached, once each, and leaves the others stored.
func TestFireDueFiresOnlyReachedTimers(t *testing.T) {
	t.Parallel()
	a := setup(t, Topology{})
	now := time.Now()
	timers := map[string]Timer{"a": RunTimer("w", "r.a.0"), "b": BranchTimer("w", "r.b.0")}
	in := map[string]time.Duration{"jetflow.run.w.r": time.Hour, "jetflow.branch.w.r.b.0": 3 * time.Hour}
	for _, tm := range timers {
		subject := tm.TaskSubject()
		require.NoError(t, ScheduleTimer(ctx(t), a.JS, tm, subject, []byte(subject), now.Add(in[subject]), now.Add(in[subject])))
	}
	stored, err := StoredTimers(ctx(t), a.Timers)
	require.NoError(t, err)
	require.Len(t, stored, 2)
	for _, st := range stored {
		want := in[st.TaskSubject]
		require.True(t, st.Due.Equal(now.Add(want)), "%s due %s", st.TaskSubject, st.Due)
		require.Equal(t, st.TaskSubject, string(st.Data))
	}

	// The server stores a fired timer on jetflow.fire.<timer> itself (no
	// core subscriber sees it): read it as the due consumer does.
	due, err := a.Timers.CreateConsumer(ctx(t), natsjs.ConsumerConfig{FilterSubject: fireSubjects, AckPolicy: natsjs.AckExplicitPolicy})
	require.NoError(t, err)
	next := func() natsjs.Msg {
		t.Helper()
		m, err := due.Next(natsjs.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		require.NoError(t, m.Ack())
		return m
	}
	n, err := FireDue(ctx(t), a.JS, a.Timers, now.Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	m := next()
	require.Equal(t, "jetflow.fire.run.w.r.a.0", m.Subject())
	require.Equal(t, "jetflow.run.w.r", string(m.Data()))
	require.Equal(t, "jetflow.run.w.r", m.Headers().Get(TaskIDHeader), "the task's message ID travels with the timer")
	firedTimer, ok := DueTimer(m.Subject())
	require.True(t, ok)
	require.Equal(t, "jetflow.run.w.r", firedTimer.TaskSubject())

	// A timer replaced after it was read is judged by its replacement.
	var b StoredTimer
	for _, st := range stored {
		if st.TaskSubject == "jetflow.branch.w.r.b.0" {
			b = st
		}
	}
	later := now.Add(5 * time.Hour)
	require.NoError(t, ScheduleTimer(ctx(t), a.JS, b.Timer, "b-2", []byte("b-2"), later, later))
	fired, err := fireIfDue(ctx(t), a.JS, a.Timers, b, now.Add(4*time.Hour))
	require.NoError(t, err)
	require.False(t, fired, "a replaced timer fired by its old due time")
	fired, err = fireIfDue(ctx(t), a.JS, a.Timers, b, now.Add(6*time.Hour))
	require.NoError(t, err)
	require.True(t, fired)
	require.Equal(t, "b-2", string(next().Data()), "the replacement fires, not the stale timer read before")
}

// A timer stored without Jetflow-Due is due at its schedule's time.
func TestTimerDueFallsBackToTheSchedule(t *testing.T) {
	t.Parallel()
	h := nats.Header{}
	h.Set("Nats-Schedule", "@at 2030-01-02T03:04:05Z")
	due, err := timerDue(h)
	require.NoError(t, err)
	require.True(t, due.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)))
	h.Set(DueHeader, "2030-01-02T03:04:05.5Z")
	due, err = timerDue(h)
	require.NoError(t, err)
	require.True(t, due.Equal(time.Date(2030, 1, 2, 3, 4, 5, 5e8, time.UTC)))
	_, err = timerDue(nats.Header{})
	require.Error(t, err)
}
