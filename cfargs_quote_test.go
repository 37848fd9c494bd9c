package sanghodedup

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestWeakSecretNotQuoted: a weak secret near an option's name, with a
// digit or a capital or not, is not quoted when it lands where an
// option goes (the next line of a multi-line {$VAR}), nor named by a
// suggestion of an option that holds a secret, which would tell how
// close it is to that word; a typo of another option is not quoted
// either. (Found by the two reviews of the quoting change: each of
// these was printed.)
func TestWeakSecretNotQuoted(t *testing.T) {
	for _, pw := range []string{"password1", "Password1", "passw0rd", "mysecret", "secret12", "Secret",
		"mypassword", "passwords", "secrets", "usernames", "retenton"} {
		t.Setenv("REVIEW_ML", "first\n"+pw)
		for _, block := range []string{
			"secret {$REVIEW_ML}",
			"secret s\n\t\tstore redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\tpassword {$REVIEW_ML}\n\t\t}",
		} {
			src := ":8080 {\n\tsangho_dedup {\n\t\t" + block + "\n\t}\n\trespond 200\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
			if err == nil || strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), "did you mean password") || strings.Contains(err.Error(), "did you mean secret") {
				t.Errorf("%q in %q: %v", pw, block, err)
			}
		}
	}
}

// TestTyposNameTheOption: an option written in camel or kebab case, or a
// Caddyfile-only option (tls_client_auth) and its typos, get the option
// meant named (found by the review of the quoting change: each was
// hidden as "may be a secret"); the token itself is not shown.
func TestTyposNameTheOption(t *testing.T) {
	for _, c := range []struct{ block, tok, meant string }{
		{"store redis {\n\t\t\ttls_client_aut a b\n\t\t}", "tls_client_aut", "tls_client_auth"},
		{"store redis {\n\t\t\ttls-insecure-skip-verify\n\t\t}", "tls-insecure-skip-verify", "tls_insecure_skip_verify"},
		{"maxBodySize 1MiB", "maxBodySize", "max_body_size"},
		{"lockTTL 1m", "lockTTL", "lock_ttl"},
	} {
		src := ":8080 {\n\tsangho_dedup {\n\t\tsecret s\n\t\t" + c.block + "\n\t}\n\trespond 200\n}\n"
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err == nil || strings.Contains(err.Error(), `"`+c.tok+`"`) || !strings.Contains(err.Error(), "did you mean "+c.meant+"?") {
			t.Errorf("%q: %v, want %s named and the token not shown", c.tok, err, c.meant)
		}
	}
}

// TestJSONNumberHintOnlyForTinyValues: the hint that a JSON number is
// nanoseconds goes with a value under a millisecond, which no one
// writes as a string; "lock_ttl": "10ms" or "retention": "500ms" are
// under their minimum without it (found by the review: they got it).
func TestJSONNumberHintOnlyForTinyValues(t *testing.T) {
	for _, c := range []struct {
		set  func(*Handler)
		hint bool
	}{
		{func(h *Handler) { h.Retention = caddy.Duration(500 * time.Millisecond) }, false},
		{func(h *Handler) { h.LockTTL = caddy.Duration(10 * time.Millisecond) }, false},
		{func(h *Handler) { h.Retention = 259200 }, true},
		{func(h *Handler) { h.LockTTL = 30 }, true},
		// a negative value is no JSON number mistake ("-5m")
		{func(h *Handler) { h.Retention = caddy.Duration(-5 * time.Minute) }, false},
	} {
		h := &Handler{Secrets: []string{secret1}, StoreRaw: json.RawMessage(`{"type":"memory"}`), KeyPrefix: testPrefix(t) + ":"}
		c.set(h)
		err := validateProvisioned(t, h)
		if err == nil || strings.Contains(err.Error(), "nanoseconds") != c.hint {
			t.Errorf("%v: want refused, with the JSON hint %v", err, c.hint)
		}
	}
}
