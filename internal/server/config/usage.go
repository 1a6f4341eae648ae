package config

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// PrintFlags writes the flags of fs for a usage text, in the style every
// jetflow command's -h uses: a double dash, the value's name, then the
// description and a non-zero default on the next line (a secret's default
// shows as Redacted, see Secret):
//
//	--ack-wait duration
//	      how long before ... (default 30s)
//
// It is flag.PrintDefaults with the double dash the commands' docs use.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	fs.VisitAll(func(f *flag.Flag) {
		plain := *f // the value's name comes from its type: unwrap a marked one
		if m, ok := f.Value.(*marked); ok {
			plain.Value = m.Value
		}
		name, usage := flag.UnquoteUsage(&plain)
		b.WriteString("  --" + f.Name)
		if name != "" {
			b.WriteString(" " + name)
		}
		b.WriteString("\n        " + strings.ReplaceAll(usage, "\n", "\n        "))
		if !zeroDefault(f.DefValue) {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		b.WriteString("\n")
	})
	_, _ = io.WriteString(w, b.String()) // a usage text has nowhere to report a failed write
}

// zeroDefault reports whether a flag's default is its type's zero value,
// which usage texts leave out.
func zeroDefault(v string) bool {
	switch v {
	case "", "false", "0", "0s":
		return true
	}
	return false
}
