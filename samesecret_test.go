package sanghodedup

import (
	"testing"
)

// TestNamedEndpointsSharingStateWarn: two endpoints with the same secret
// on one store and key_prefix share their event IDs: one event sent to
// both (a Shopify app's client secret signs every subscription, and
// Shopify sends one event to each with the same X-Shopify-Event-Id)
// reaches only the first one's backend, the other answered as its
// duplicate. Different secrets are refused; the same secret is taken
// for one endpoint on several routes, which it is when the two have one
// name. Named apart, they warn at load, naming both (found by the
// configuration review: no word, and the second backend never saw the
// event).
func TestNamedEndpointsSharingStateWarn(t *testing.T) {
	site := func(name1, name2 string) string {
		block := func(path, name string) string {
			n := ""
			if name != "" {
				n = "\t\t\tname " + name + "\n"
			}
			return "\thandle " + path + " {\n\t\tsangho_dedup {\n\t\t\tprovider shopify\n\t\t\tsecret " + secret1 + "\n" + n + "\t\t\tstore memory\n\t\t}\n\t\trespond 200\n\t}\n"
		}
		return block("/orders", name1) + block("/inventory", name2)
	}
	for _, c := range []struct {
		name1, name2 string
		warn         bool
	}{
		{"orders", "inventory", true},
		{"", "inventory", true},
		{"", "", false},
		{"shop", "shop", false},
	} {
		all, text := warnedAtLoad(t, site(c.name1, c.name2), "endpoints share their event IDs")
		var warned int
		for _, e := range all {
			if e["fix"] != nil {
				warned++
			}
		}
		if c.warn && warned != 1 || !c.warn && warned != 0 {
			t.Errorf("names %q and %q: %d warnings, want warned %v; log:\n%s", c.name1, c.name2, warned, c.warn, text)
		}
	}
}
