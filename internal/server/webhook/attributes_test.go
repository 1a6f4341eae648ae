package webhook

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A source's attributes are read by JSON pointer (RFC 6901: ~1 is "/", ~0
// is "~", array indexes in decimal), strings as they are and numbers and
// booleans as their JSON text; whatever a pointer cannot give is left
// out, and a pointer that does not parse, or an attribute name outside
// the limits, makes the source invalid.
func TestAttributesOf(t *testing.T) {
	t.Parallel()
	ptr := func(s string) Pointer {
		p, err := ParsePointer(s)
		require.NoError(t, err, s)
		return p
	}
	src := Source{Attributes: map[string]Pointer{
		"order_id": ptr("/data/object/metadata/order_id"),
		"slash":    ptr("/a~1b"),
		"tilde":    ptr("/m~0n"),
		"first":    ptr("/items/0/sku"),
		"big":      ptr("/n"),
		"paid":     ptr("/paid"),
		"past":     ptr("/items/2/sku"),
		"leading":  ptr("/items/01/sku"),
		"obj":      ptr("/data"),
		"null":     ptr("/none"),
		"ctl":      ptr("/ctl"),
		"empty":    ptr("/empty"),
		"gone":     ptr("/nowhere/deeper"),
	}}
	payload := `{"data":{"object":{"metadata":{"order_id":"42"}}},"a/b":"s","m~n":"t",` +
		`"items":[{"sku":"k-1"},{"sku":"k-2"}],"n":12345678901234567890,"paid":true,"none":null,` +
		`"ctl":"a\nb","empty":""}`
	require.Equal(t, map[string]string{"order_id": "42", "slash": "s", "tilde": "t", "first": "k-1",
		"big": "12345678901234567890", "paid": "true"}, src.AttributesOf([]byte(payload)))
	require.Nil(t, src.AttributesOf([]byte(`not json`)))
	require.Nil(t, Source{}.AttributesOf([]byte(payload)))
	whole := Source{Attributes: map[string]Pointer{"v": ptr("")}}
	require.Equal(t, map[string]string{"v": "7"}, whole.AttributesOf([]byte(`7`)))

	for _, bad := range []string{"data", "/a~2", "/a~"} {
		_, err := ParsePointer(bad)
		require.ErrorIs(t, err, ErrInvalidSource, bad)
	}
	valid := Source{Name: "s", Provider: Stripe, Workflow: "w", Secrets: []string{"whsec_x"}}
	require.NoError(t, valid.Validate())
	valid.Attributes = map[string]Pointer{"Order": ptr("/x")}
	require.ErrorContains(t, valid.Validate(), `attribute name "Order"`)
	valid.Attributes = map[string]Pointer{}
	for i := range 9 {
		valid.Attributes["a"+strings.Repeat("b", i)] = ptr("/x")
	}
	require.ErrorContains(t, valid.Validate(), "Attributes: 9, limit 8")
}
