// Package logging builds the zerolog loggers of jetflow's commands: JSON
// lines by default, a console format for a person at a terminal.
//
// # Conventions
//
// Every line about a run carries the fields workflow and run_id (a step's
// line step_id too). A duration is a string with its unit, written by
// Duration ("193ms", "30s", "1m30s"), never a bare number: jetflow's code
// does not use zerolog's Dur, whose number has no unit.
package logging

import (
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// Formats a command accepts for --log-format.
const (
	JSON    = "json"
	Console = "console"
)

// IsTerminal reports whether w is a terminal (an *os.File that is a
// character device).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// DefaultFormat is Console when w is a terminal, JSON otherwise.
func DefaultFormat(w io.Writer) string {
	return ChooseFormat("", IsTerminal(w))
}

// ChooseFormat is the format of a command's log: the one the command was
// told (--log-format or its JETFLOW_LOG_FORMAT, json or console; checked
// by the caller) whatever the output is, else Console for a person at a
// terminal and JSON for anything else (a pipe, a file, a log collector).
func ChooseFormat(told string, terminal bool) string {
	switch {
	case told != "":
		return told
	case terminal:
		return Console
	default:
		return JSON
	}
}

// New returns a logger writing to w at level: JSON lines with a timestamp,
// or for Console a human-readable line (colour only on a terminal).
func New(w io.Writer, format string, level zerolog.Level) zerolog.Logger {
	if format == Console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !IsTerminal(w)}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// Duration formats d for a log field: Go's duration syntax with its unit,
// rounded to the millisecond from one millisecond up ("193ms", "1.5s",
// "2m0s") and to the microsecond below ("250µs"), so that a line reads
// without a trail of nanoseconds.
func Duration(d time.Duration) string {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Microsecond).String()
}
