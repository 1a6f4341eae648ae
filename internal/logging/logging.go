// Package logging builds the zerolog loggers of jetflow's commands: JSON
// lines by default, a console format for a person at a terminal.
package logging

import (
	"io"
	"os"

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

// New returns a logger writing to w at level: JSON lines with a timestamp,
// or for Console a human-readable line (colour only on a terminal).
func New(w io.Writer, format string, level zerolog.Level) zerolog.Logger {
	if format == Console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !IsTerminal(w)}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}
