package config

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// Print writes every setting of fs with its effective value, one
// `name: value # origin` line each in flag name order, as YAML that Load
// accepts as a config file. The origin comment is the one origins records
// ("default" for a flag it lacks). A secret that is set prints as Redacted
// and an unset one as ""; a flag with a Redactor prints as it redacts it. Command-line-only flags and --config are left
// out. It returns the first write error.
func Print(w io.Writer, fs *flag.FlagSet, origins Origins) error {
	var b bytes.Buffer
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == FileFlag || isCommandLineOnly(f) {
			return
		}
		v := printed(f)
		fmt.Fprintf(&b, "%s: %s # %s\n", f.Name, scalar(v), origins[f.Name])
	})
	_, err := w.Write(b.Bytes())
	return err
}

// scalar writes v as a YAML scalar that reads back as exactly v: plain when
// that is unambiguous, double-quoted otherwise.
func scalar(v string) string {
	if v != "" {
		var doc yaml.Node
		err := yaml.Unmarshal([]byte("k: "+v+" # c\n"), &doc)
		if err == nil && len(doc.Content) == 1 && len(doc.Content[0].Content) == 2 {
			n := doc.Content[0].Content[1]
			if n.Kind == yaml.ScalarNode && n.Style == 0 && n.Tag != "!!null" && n.Value == v {
				return v
			}
		}
	}
	// A YAML double-quoted scalar accepts Go's escapes for the characters
	// strconv.Quote escapes.
	return strconv.Quote(v)
}
