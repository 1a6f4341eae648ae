package config

import (
	"flag"
	"fmt"
	"reflect"
)

// Secret marks the named flags of fs as secrets: Print shows them as
// Redacted (or empty when unset), usage text shows a non-empty default as
// Redacted, and errors never quote their values. Mark
// a flag before Load. Marking a flag again changes nothing. It panics if fs
// has no such flag, as flag.FlagSet does for a flag defined twice: both are
// wiring mistakes of the program, not of its user.
func Secret(fs *flag.FlagSet, names ...string) {
	for _, name := range names {
		m := mark(fs, name)
		m.secret = true
		if f := fs.Lookup(name); f.DefValue != "" {
			f.DefValue = Redacted // kept out of usage text
		}
	}
}

// Redactor marks flag name of fs as holding a value that may embed a
// secret (a URL with credentials): Print shows redact(value) instead of the
// value. Marking again replaces redact; it panics if fs has no such flag.
func Redactor(fs *flag.FlagSet, name string, redact func(string) string) {
	mark(fs, name).redact = redact
}

// CommandLineOnly marks the named flags of fs as commands rather than
// settings (--print-config, say): Load reads them from the command line
// alone, never from the environment or a config file (a file naming one is
// an error), and Print leaves them out. Marking again changes nothing; it
// panics if fs has no such flag.
func CommandLineOnly(fs *flag.FlagSet, names ...string) {
	for _, name := range names {
		mark(fs, name).commandLineOnly = true
	}
}

// marked wraps a flag's value to carry its marks with it, so that packages
// that register flags (natsconn) can mark them on the FlagSet alone.
type marked struct {
	flag.Value
	secret          bool
	commandLineOnly bool
	redact          func(string) string
}

func mark(fs *flag.FlagSet, name string) *marked {
	f := fs.Lookup(name)
	if f == nil {
		panic(fmt.Sprintf("config: flag --%s is not defined on %s", name, fs.Name()))
	}
	m, ok := f.Value.(*marked)
	if !ok {
		// The usage printer tells a default worth showing by comparing
		// DefValue with the String of a zero Value of the flag's type,
		// which for the wrapper is always "": keep its verdict by clearing
		// a DefValue that is the wrapped type's zero ("false", "0").
		if isZero(f.Value, f.DefValue) {
			f.DefValue = ""
		}
		m = &marked{Value: f.Value}
		f.Value = m
	}
	return m
}

// isZero reports whether def is what a zero value of v's type prints.
func isZero(v flag.Value, def string) (zero bool) {
	defer func() {
		if recover() != nil { // a String method that needs a non-zero value
			zero = false
		}
	}()
	t := reflect.TypeOf(v)
	var z reflect.Value
	if t.Kind() == reflect.Pointer {
		z = reflect.New(t.Elem())
	} else {
		z = reflect.Zero(t)
	}
	return z.Interface().(flag.Value).String() == def
}

// String is the wrapped value's; "" for the zero marked that flag's usage
// printer makes to detect defaults.
func (m *marked) String() string {
	if m == nil || m.Value == nil {
		return ""
	}
	return m.Value.String()
}

// IsBoolFlag keeps boolean flags usable as --name without a value.
func (m *marked) IsBoolFlag() bool {
	b, ok := m.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Get returns the wrapped value's Get, or its String.
func (m *marked) Get() any {
	if g, ok := m.Value.(flag.Getter); ok {
		return g.Get()
	}
	return m.String()
}

func isSecret(f *flag.Flag) bool {
	m, ok := f.Value.(*marked)
	return ok && m.secret
}

// printed is f's value as Print shows it: Redacted for a secret that is
// set, redacted by its Redactor, or as it is.
func printed(f *flag.Flag) string {
	v := f.Value.String()
	m, ok := f.Value.(*marked)
	switch {
	case !ok || v == "":
		return v
	case m.secret:
		return Redacted
	case m.redact != nil:
		return m.redact(v)
	}
	return v
}

func isCommandLineOnly(f *flag.Flag) bool {
	m, ok := f.Value.(*marked)
	return ok && m.commandLineOnly
}
