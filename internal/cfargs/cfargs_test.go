package cfargs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Human writes a bound as a user writes it, and what it writes parses
// back to the same duration.
func TestHuman(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Millisecond:            "30ms",
		time.Hour:                        "1h",
		90 * time.Minute:                 "1h30m",
		24 * time.Hour:                   "24h",
		36 * time.Hour:                   "36h",
		48 * time.Hour:                   "2d",
		7 * 24 * time.Hour:               "7d",
		3650 * 24 * time.Hour:            "3650d",
		7*24*time.Hour + time.Second:     "168h0m1s",
		time.Hour + 500*time.Millisecond: "1h0m0.5s",
	} {
		if got := Human(d); got != want {
			t.Errorf("Human(%v) = %q, want %q", d, got, want)
		}
	}
}

// Range's bounds are inclusive; 0 is no bound.
func TestRange(t *testing.T) {
	for _, c := range []struct {
		v, min, max time.Duration
		want        string
	}{
		{time.Second, time.Second, time.Hour, ""},
		{time.Hour, time.Second, time.Hour, ""},
		{time.Hour + 1, 0, time.Hour, `x: "v" is over the maximum of 1h`},
		{time.Second - 1, time.Second, 0, `x: "v" is under the minimum of 1s`},
		{1000 * time.Hour, 0, 0, ""},
	} {
		got := ""
		if err := Range("x", `"v"`, c.v, c.min, c.max); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("Range(%v, %v, %v) = %q, want %q", c.v, c.min, c.max, got, c.want)
		}
	}
}

// The variables named for an option left empty are its line's own: a
// comment's {$VAR} after it is not one of them.
func TestWithoutValueNamesTheLinesVariables(t *testing.T) {
	const a, b = "SANGHO_DEDUP_TEST_UNSET_A", "SANGHO_DEDUP_TEST_UNSET_B"
	os.Unsetenv(a)
	os.Unsetenv(b)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	src := "x {\n\tpassword {$" + a + "} # was {$" + b + "}\n\tpassword \"{$" + a + "}#{$" + b + "}\"\n}\n"
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	msg := WithoutValue("password", file, 2)
	if !strings.Contains(msg, "{$"+a+"}") || strings.Contains(msg, b) {
		t.Errorf("a comment's variable named: %s", msg)
	}
	if !strings.Contains(msg, "environment of the caddy command that read the Caddyfile") {
		t.Errorf("the message does not say whose environment: %s", msg)
	}
	// A # inside a quoted value is not a comment.
	if msg := WithoutValue("password", file, 3); !strings.Contains(msg, "{$"+a+"}, {$"+b+"}") {
		t.Errorf("a quoted value's variables: %s", msg)
	}
}

// A token is an option's typo within one edit (two from ten
// characters), a swap of neighbours counting one, in lower case and _
// only; or the option in camel or kebab case; a secret is not.
func TestNearOption(t *testing.T) {
	own := []string{"dsn", "table", "max_conns", "retention"}
	for tok, want := range map[string]string{
		"dsn": "dsn", "dns": "dsn", "tabel": "table", "max_con": "", "max_conn": "max_conns", "maxConns": "max_conns", "max-conns": "max_conns", "Secret": "", "mysecret": "", "secret1": "", "retenton": "retention",
		"rettention": "retention", "x": "", "nope": "", "whsec_9a8b7c6d5e4f3a2b": "", "retentionxyz": "",
	} {
		if got := nearOption(tok, own); got != want {
			t.Errorf("nearOption(%q) = %q, want %q", tok, got, want)
		}
	}
	for _, c := range []struct {
		a, b  string
		limit int
		want  int
	}{
		{"abc", "abc", 2, 0}, {"abc", "acb", 2, 1}, {"abc", "abd", 2, 1}, {"abc", "ab", 2, 1},
		{"abc", "xyz", 2, 3}, {"abc", "abcdef", 2, 3}, {"ca", "abc", 3, 3}, {"", "ab", 2, 2},
	} {
		if got := editDistance(c.a, c.b, c.limit); got != c.want {
			t.Errorf("editDistance(%q, %q, %d) = %d, want %d", c.a, c.b, c.limit, got, c.want)
		}
	}
}
