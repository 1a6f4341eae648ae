// Package config layers a command's settings over a standard flag.FlagSet,
// so that every jetflow command reads them the same way.
//
// # Precedence
//
// Each flag takes its value from the first of these that sets it:
//
//  1. the command line (--concurrency 8);
//  2. the environment, JETFLOW_<FLAG> (JETFLOW_CONCURRENCY=8; see EnvName),
//     where an empty variable counts as unset;
//  3. the config file named by --config or JETFLOW_CONFIG;
//  4. the flag's default.
//
// # Config file
//
// The file is YAML whose top-level keys are flag names and whose values are
// scalars written as on the command line:
//
//	nats-url: nats://nats-1:4222
//	concurrency: 128
//	ack-wait: 30s
//
// An unknown key, a repeated key, a value that is not a scalar, or a value
// the flag rejects is an error naming the file, the key and the line.
// Print writes a file in this format.
//
// # Marks
//
// Secret marks a flag whose value is never printed nor put in an error
// message; CommandLineOnly marks a flag (such as --print-config) that is read
// from the command line alone and is not a setting.
package config

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// FileFlag is the flag that names the config file. Its environment variable
// is JETFLOW_CONFIG; a config file cannot set it.
const FileFlag = "config"

// EnvPrefix starts the name of every environment variable a flag falls back
// to.
const EnvPrefix = "JETFLOW_"

// Redacted is how Print shows a secret that is set. Load refuses it as the
// value of a secret, so that a printed config fed back as a file cannot log
// in with the placeholder.
const Redacted = "<redacted>"

// Sentinel errors, matched with errors.Is on the errors Load returns.
var (
	// ErrUnknownKey: a config file key that is no flag of the command.
	ErrUnknownKey = errors.New("unknown setting")
	// ErrNotAllowed: a config file key naming a flag that only the command
	// line (or, for --config, the environment) may set.
	ErrNotAllowed = errors.New("not allowed in a config file")
	// ErrDuplicateKey: a key given twice in a config file.
	ErrDuplicateKey = errors.New("setting given twice")
	// ErrNotScalar: a config file value that is a list, a map or an alias.
	ErrNotScalar = errors.New("value must be a single scalar, as on the command line")
	// ErrMalformed: a config file that is not YAML, or not a map at the top.
	ErrMalformed = errors.New("malformed config file")
	// ErrRedacted: a secret whose value is the Redacted placeholder.
	ErrRedacted = errors.New(Redacted + " is the placeholder --print-config shows, not the secret; give the secret itself")
)

// Source says where a setting's value came from.
type Source int

// The sources, lowest precedence first.
const (
	// FromDefault: no source set the flag.
	FromDefault Source = iota
	// FromFile: the config file.
	FromFile
	// FromEnv: the flag's environment variable.
	FromEnv
	// FromFlag: the command line.
	FromFlag
)

// Origin is where one flag's effective value came from.
type Origin struct {
	Source Source
	// Name is the environment variable (FromEnv) or the file path
	// (FromFile); empty otherwise.
	Name string
	// Line is the line of the setting in the config file (FromFile), 0 if
	// unknown.
	Line int
}

// String is the origin as Print writes it: "default", "flag",
// "env JETFLOW_X" or "file PATH".
func (o Origin) String() string {
	switch o.Source {
	case FromFile:
		return "file " + o.Name
	case FromEnv:
		return "env " + o.Name
	case FromFlag:
		return "flag"
	default:
		return "default"
	}
}

// from is the origin as an error names it, or "" for the command line and
// the default, which need no explanation.
func (o Origin) from() string {
	switch {
	case o.Source == FromEnv:
		return " (from " + o.Name + ")"
	case o.Source == FromFile && o.Line > 0:
		return fmt.Sprintf(" (from %s line %d)", o.Name, o.Line)
	case o.Source == FromFile:
		return " (from " + o.Name + ")"
	}
	return ""
}

// Origins maps every flag name of a FlagSet to the origin of its value.
type Origins map[string]Origin

// Flag names flag name for an error message about its value: "--name", with
// " (from JETFLOW_NAME)" or " (from FILE line N)" when the value did not
// come from the command line or the default.
func (o Origins) Flag(name string) string {
	return "--" + name + o[name].from()
}

// SettingError is a value a flag rejected. For a secret flag, Error shows
// neither the value nor the flag's own message (which may quote it); Unwrap
// still returns that message's error.
type SettingError struct {
	Flag   string // flag name, without dashes
	Value  string // empty for a secret
	Origin Origin
	Secret bool
	Err    error
}

// Error reads `invalid value "x" for --flag (from ORIGIN): reason`.
func (e *SettingError) Error() string {
	if e.Secret {
		msg := "invalid value for --" + e.Flag + e.Origin.from()
		if errors.Is(e.Err, ErrRedacted) {
			msg += ": " + ErrRedacted.Error()
		}
		return msg
	}
	return fmt.Sprintf("invalid value %q for --%s%s: %v", e.Value, e.Flag, e.Origin.from(), e.Err)
}

// Unwrap returns the flag's error.
func (e *SettingError) Unwrap() error { return e.Err }

// FileError is a config file that could not be read, parsed or applied as
// a whole, or one of its keys. Other YAML files of the commands (producer
// serve's --webhooks) report their errors with it too, naming the file and
// what Key is with Kind and KeyKind.
type FileError struct {
	Path string
	Line int    // 0 when unknown
	Key  string // empty when the problem is not one key
	Err  error
	// Kind says what the file is, "config file" when empty.
	Kind string
	// KeyKind says what Key is, "key" when empty.
	KeyKind string
}

// Error reads `config file PATH line N: key "K": reason`, with Kind and
// KeyKind in place of "config file" and "key" when set.
func (e *FileError) Error() string {
	kind, keyKind := e.Kind, e.KeyKind
	if kind == "" {
		kind = "config file"
	}
	if keyKind == "" {
		keyKind = "key"
	}
	var b strings.Builder
	b.WriteString(kind + " " + e.Path)
	if e.Line > 0 {
		fmt.Fprintf(&b, " line %d", e.Line)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, ": %s %q", keyKind, e.Key)
	}
	b.WriteString(": " + e.Err.Error())
	return b.String()
}

// Unwrap returns the cause, one of the sentinels or an I/O or YAML error.
func (e *FileError) Unwrap() error { return e.Err }

// EnvName is the environment variable flag name falls back to:
// JETFLOW_ plus the name in upper case with dashes as underscores
// (ack-wait reads JETFLOW_ACK_WAIT).
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Load parses args (without the program name) into fs, then sets every flag
// the command line did not from the environment through getenv (nil reads
// no environment) or, failing that, from the config file, and returns where
// each flag's value came from. It defines the --config flag if fs has none.
//
// Parsing stops at the first non-flag argument, as fs.Parse does; the caller
// decides what fs.Args() may hold. Errors from the command line are the flag
// package's (flag.ErrHelp for -h); errors from the environment are
// *SettingError, from the file *FileError or *SettingError. Load may be
// called once per FlagSet.
func Load(fs *flag.FlagSet, args []string, getenv func(string) string) (Origins, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if fs.Lookup(FileFlag) == nil {
		fs.String(FileFlag, "", "YAML `file` of settings keyed by flag name (lower precedence than the environment and flags)")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	origins := make(Origins)
	fs.VisitAll(func(f *flag.Flag) { origins[f.Name] = Origin{Source: FromDefault} })
	fs.Visit(func(f *flag.Flag) { origins[f.Name] = Origin{Source: FromFlag} })

	if origins[FileFlag].Source != FromFlag {
		if err := setFromEnv(fs.Lookup(FileFlag), getenv, origins); err != nil {
			return nil, err
		}
	}
	var file map[string]fileValue
	if path := fs.Lookup(FileFlag).Value.String(); path != "" {
		var err error
		if file, err = readFile(fs, path); err != nil {
			return nil, err
		}
	}

	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || f.Name == FileFlag || isCommandLineOnly(f) || origins[f.Name].Source == FromFlag {
			return
		}
		if getenv(EnvName(f.Name)) != "" {
			err = setFromEnv(f, getenv, origins)
			return
		}
		if v, ok := file[f.Name]; ok {
			err = set(f, v.value, Origin{Source: FromFile, Name: v.path, Line: v.line}, origins)
		}
	})
	if err != nil {
		return nil, err
	}
	return origins, nil
}

// setFromEnv sets f from its environment variable, if that is not empty.
func setFromEnv(f *flag.Flag, getenv func(string) string, origins Origins) error {
	name := EnvName(f.Name)
	v := getenv(name)
	if v == "" {
		return nil
	}
	return set(f, v, Origin{Source: FromEnv, Name: name}, origins)
}

// set gives f the value v from origin o and records o.
func set(f *flag.Flag, v string, o Origin, origins Origins) error {
	secret := isSecret(f)
	err := f.Value.Set(v)
	if err == nil && secret && v == Redacted {
		err = ErrRedacted
	}
	if err != nil {
		e := &SettingError{Flag: f.Name, Origin: o, Secret: secret, Err: err}
		if !secret {
			e.Value = v
		}
		return e
	}
	origins[f.Name] = o
	return nil
}
