package dedupe

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/jetflow/jetflow/jetflowtype"
)

// DiffFields names the top-level fields that differ as the fingerprint
// sees them (key order, white space and nested key order aside; numbers as
// written), with how each changed, and nothing for inputs that are not
// both objects.
func TestDiffFields(t *testing.T) {
	t.Parallel()
	d := func(name, change string) jetflowtype.FieldDiff {
		return jetflowtype.FieldDiff{Name: name, Change: change}
	}
	for _, tc := range []struct {
		name              string
		stored, requested string
		want              []jetflowtype.FieldDiff
		ok                bool
	}{
		{"added, removed, changed", `{"a":1,"b":"x","c":true}`, `{"a":2,"c":true,"d":null}`,
			[]jetflowtype.FieldDiff{d("a", "changed"), d("b", "removed"), d("d", "added")}, true},
		{"same value otherwise written", `{"a":{"x":1,"y":[1,2]},"b":"s"}`, ` { "b" : "s", "a" : {"y":[1, 2],"x":1} } `, nil, true},
		{"numbers as written", `{"n":1}`, `{"n":1.0}`, []jetflowtype.FieldDiff{d("n", "changed")}, true},
		{"nested change is its top-level field", `{"o":{"x":1}}`, `{"o":{"x":2}}`, []jetflowtype.FieldDiff{d("o", "changed")}, true},
		{"array order", `{"l":[1,2]}`, `{"l":[2,1]}`, []jetflowtype.FieldDiff{d("l", "changed")}, true},
		{"null is a value", `{"a":null}`, `{}`, []jetflowtype.FieldDiff{d("a", "removed")}, true},
		{"not objects", `1`, `2`, nil, false},
		{"object and array", `{"a":1}`, `[1]`, nil, false},
		{"null and object", `null`, `{"a":1}`, nil, false},
		{"no stored input", ``, `{"a":1}`, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, more, ok := DiffFields(json.RawMessage(tc.stored), json.RawMessage(tc.requested))
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
			require.Zero(t, more)
		})
	}
}

// Names only, never values; at most MaxConflictFields, the rest counted;
// a very long name cut.
func TestDiffFieldsBounds(t *testing.T) {
	t.Parallel()
	stored, requested := map[string]string{}, map[string]string{}
	n := jetflowtype.MaxConflictFields + 5
	for i := range n {
		k := fmt.Sprintf("f%03d", i)
		stored[k], requested[k] = "secret-old", "secret-new"
	}
	long := strings.Repeat("é", 40) // 80 bytes
	requested[long] = "v"
	a, _ := json.Marshal(stored)
	b, _ := json.Marshal(requested)
	got, more, ok := DiffFields(a, b)
	require.True(t, ok)
	require.Len(t, got, jetflowtype.MaxConflictFields)
	require.Equal(t, n+1-jetflowtype.MaxConflictFields, more)
	require.Equal(t, "f000", got[0].Name, "sorted by name")
	out, _ := json.Marshal(got)
	require.NotContains(t, string(out), "secret")

	got, _, _ = DiffFields([]byte(`{}`), []byte(`{"`+long+`":1}`))
	require.Equal(t, []jetflowtype.FieldDiff{{Name: strings.Repeat("é", 32) + "…", Change: jetflowtype.FieldAdded}}, got)
}
