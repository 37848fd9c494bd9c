package sanghodedup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// TestMain keeps the tests away from the user's Caddy data directory:
// the default (file) store lives there.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sangho-dedup-test-data-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	// Caddy's storage (its locks, certificates, last_clean.json) took
	// its path from the environment before this ran: move it too.
	caddy.DefaultStorage.Path = caddy.AppDataDir()
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestProvisionErrors(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	t.Setenv("SANGHO_EMPTY_SECRET", "")
	for name, h := range map[string]*Handler{
		"no secret":    {},
		"empty secret": {Secrets: []string{"{env.SANGHO_EMPTY_SECRET}"}},
	} {
		if err := h.Provision(ctx); err == nil {
			t.Errorf("%s: provisioned", name)
		}
	}
	for name, h := range map[string]*Handler{
		"bad on_store_error":        {Secrets: []string{"s"}, OnStoreError: "maybe"},
		"tiny lock_ttl":             {Secrets: []string{"s"}, LockTTL: caddy.Duration(time.Millisecond)},
		"negative tolerance":        {Secrets: []string{"s"}, Tolerance: -1},
		"max_body_size over 64 MiB": {Secrets: []string{"s"}, MaxBodySize: 64<<20 + 1},
		"bad header":                {Secrets: []string{"s"}, EventIDHeader: "a b"},
	} {
		if err := h.Provision(ctx); err != nil {
			t.Errorf("%s: provision: %v", name, err)
			continue
		}
		if err := h.Validate(); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	// key_prefix is checked before anything uses it (the handler's
	// default name, a metric label, is made from it).
	for name, h := range map[string]*Handler{
		"key_prefix placeholder": {Secrets: []string{"s"}, KeyPrefix: "{env.TENANT}:"},
		"key_prefix space":       {Secrets: []string{"s"}, KeyPrefix: "p x:"},
		// PostgreSQL refused every key with a NUL: every delivery a 503
		// (found by review). A control character or a byte that is not
		// UTF-8 is refused at load, whatever the store.
		"key_prefix NUL":       {Secrets: []string{"s"}, KeyPrefix: "p\x00x:"},
		"key_prefix control":   {Secrets: []string{"s"}, KeyPrefix: "p\x1bx:"},
		"key_prefix not UTF-8": {Secrets: []string{"s"}, KeyPrefix: "p\xffx:"},
		"key_prefix NBSP":      {Secrets: []string{"s"}, KeyPrefix: "p\u00a0x:"},
	} {
		err := h.Provision(ctx)
		if err == nil {
			err = h.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), "key_prefix") {
			t.Errorf("%s: %v, want an error naming key_prefix", name, err)
		}
	}
	t.Setenv("SANGHO_TEST_SECRET", secret1)
	h := &Handler{Secrets: []string{"{env.SANGHO_TEST_SECRET}"}, KeyPrefix: "env_secret:", now: testClock}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := verifySangho(h, "t=1733140800,v1="+vectors[0].V1, []byte(bodyA)); err != nil {
		t.Fatalf("secret from {env.X} not resolved: %v", err)
	}
}

// TestSecretPlaceholders: only a secret that is one whole placeholder
// ({env.X}, {file./path}) is resolved; any other value is the secret
// itself, braces included. A whole placeholder that is unset or empty is
// a config error naming the secret's number and the placeholder, never a
// secret.
func TestSecretPlaceholders(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	t.Setenv("SANGHO_TEST_SECRET", secret1)
	t.Setenv("SANGHO_EMPTY_SECRET", "")
	file := t.TempDir() + "/secret"
	if err := os.WriteFile(file, []byte(secret2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	body := []byte(bodyA)
	signedWith := func(secret string) string { return sangho.Sign(testNow, body, secret) }
	for _, c := range []struct {
		secret  string
		accepts string // a request signed with this secret verifies
		refuses string // and one signed with this does not
	}{
		{"whsec_ab{cd}ef", "whsec_ab{cd}ef", "whsec_abef"},
		{"whsec_{env.SANGHO_TEST_SECRET}", "whsec_{env.SANGHO_TEST_SECRET}", "whsec_" + secret1},
		{"whsec_{env.SANGHO_UNSET_SECRET_X}", "whsec_{env.SANGHO_UNSET_SECRET_X}", "whsec_"},
		{"{env.SANGHO_TEST_SECRET}", secret1, "{env.SANGHO_TEST_SECRET}"},
		{"{file." + file + "}", secret2, secret2 + "\n"},
		{"{env.SANGHO_TEST_SECRET} ", "{env.SANGHO_TEST_SECRET} ", secret1},
	} {
		// one config each: handlers of one config with different secrets
		// may not share a store and prefix
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		h := &Handler{Secrets: []string{c.secret}, StoreRaw: []byte(`{"type":"memory"}`), now: testClock}
		if err := h.Provision(ctx); err != nil {
			t.Errorf("%q: %v", c.secret, err)
			continue
		}
		if err := verifySangho(h, signedWith(c.accepts), body); err != nil {
			t.Errorf("secret %q: a request signed with %q is refused: %v", c.secret, c.accepts, err)
		}
		if err := verifySangho(h, signedWith(c.refuses), body); err == nil {
			t.Errorf("secret %q: a request signed with %q is accepted", c.secret, c.refuses)
		}
	}
	for _, c := range []struct {
		secrets []string
		want    string
	}{
		{[]string{secret2, "{env.SANGHO_UNSET_SECRET_X}"}, "secret #2: placeholder {env.SANGHO_UNSET_SECRET_X} is unset or empty"},
		{[]string{"{env.SANGHO_EMPTY_SECRET}"}, "secret #1: placeholder {env.SANGHO_EMPTY_SECRET} is unset or empty"},
		{[]string{secret2, secret1, "{file." + file + ".missing}"}, "secret #3: placeholder {file." + file + ".missing} is unset or empty"},
		{[]string{"{" + secret1 + "}"}, "secret #1 is a placeholder that Caddy does not know"},
		{[]string{secret1, ""}, "secret #2 is empty"},
	} {
		h := &Handler{Secrets: c.secrets, StoreRaw: []byte(`{"type":"memory"}`)}
		err := h.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want it to contain %q", c.secrets, err, c.want)
			continue
		}
		for _, s := range []string{secret1, secret2} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("the error prints a secret: %v", err)
			}
		}
	}
}

// TestMetricsRegisteredWithCaddy: the collectors are in the registry of
// every config that provisions the handler (a reload registers them again
// without error) and keep their counts across configs.
func TestMetricsRegisteredWithCaddy(t *testing.T) {
	var regs []*caddy.Context
	for range 2 {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		h := &Handler{Secrets: []string{secret1}, StoreRaw: []byte(`{"type":"memory"}`), KeyPrefix: "reg:", now: testClock}
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("provision (a reload re-registers): %v", err)
		}
		serve(h, signedRequest(bodyA, ""), &countingNext{})
		regs = append(regs, &ctx)
	}
	for i, ctx := range regs {
		families, err := ctx.GetMetricsRegistry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range families {
			if f.GetName() == "caddy_sangho_dedup_events_total" {
				found = true
				var processed float64
				for _, m := range f.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
						if l.GetName() != "outcome" && l.GetName() != "endpoint" {
							t.Errorf("unexpected label %q", l.GetName())
						}
					}
					if labels["endpoint"] == "reg" && labels["outcome"] == outcomeProcessed {
						processed = m.GetCounter().GetValue()
					}
				}
				// One series per endpoint (the handler's name, here its
				// key_prefix without the colon), counting across both configs.
				if processed < 1 {
					t.Errorf("config %d: no processed count for endpoint \"reg\"", i)
				}
			}
		}
		if !found {
			t.Errorf("config %d: caddy_sangho_dedup_events_total not in Caddy's metrics registry", i)
		}
	}
}

// TestNames: a handler's name defaults to its key_prefix without the
// trailing colon; two handlers of one config with one name need the same
// store and prefix.
func TestNames(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &Handler{Secrets: []string{secret1}, KeyPrefix: "a:", StoreRaw: json.RawMessage(`{"type":"memory"}`)}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Name != "a" {
		t.Fatalf("default name %q, want the key_prefix without its colon", a.Name)
	}
	for prefix, want := range map[string]string{"t:x:": "t:x", "plain_": "plain_", ":": ":", "c::": "c:"} {
		if got := defaultName(prefix); got != want {
			t.Errorf("default name of key_prefix %q: %q, want %q", prefix, got, want)
		}
	}
	same := &Handler{Secrets: []string{secret1}, KeyPrefix: "a:", StoreRaw: json.RawMessage(`{"type":"memory"}`)}
	if err := same.Provision(ctx); err != nil {
		t.Fatalf("the same endpoint on a second route: %v", err)
	}
	clash := &Handler{Secrets: []string{secret2}, KeyPrefix: "b:", Name: "a", StoreRaw: json.RawMessage(`{"type":"memory"}`)}
	err := clash.Provision(ctx)
	if err == nil || !strings.Contains(err.Error(), `named "a"`) || !strings.Contains(err.Error(), "own name") {
		t.Fatalf("a name on two endpoints: %v", err)
	}
	if got := currentEndpoints(); got["a"] != a {
		t.Fatalf("current endpoints %v", got)
	}
}

// TestPayloadMismatchDefaults: reject with Sangho, whose contract
// promises the same body on every attempt; log with the other providers.
func TestPayloadMismatchDefaults(t *testing.T) {
	for scheme, want := range map[string]string{"": mismatchReject, "sangho": mismatchReject, "github": mismatchLog, "stripe": mismatchLog} {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		h := &Handler{Secrets: []string{"whsec_x"}, StoreRaw: json.RawMessage(`{"type":"memory"}`)}
		if scheme != "" {
			h.ProviderRaw = json.RawMessage(`{"name":"` + scheme + `"}`)
		}
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("%s: %v", scheme, err)
		}
		if h.OnPayloadMismatch != want {
			t.Errorf("provider %q: on_payload_mismatch defaults to %q, want %q", scheme, h.OnPayloadMismatch, want)
		}
		cancel()
	}
}

// TestDurationBounds: every duration option has a documented maximum,
// and a value past it is an error naming the option; the maximum itself
// is accepted. (Found by review: retention 100000d validated, and the
// file store then treated every record as expired.)
func TestDurationBounds(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, c := range []struct {
		option string
		set    func(*Handler, time.Duration)
		max    time.Duration
		maxIs  string
	}{
		{"retention", func(h *Handler, d time.Duration) { h.Retention = caddy.Duration(d) }, MaxRetention, "3650d"},
		{"lock_ttl", func(h *Handler, d time.Duration) { h.LockTTL = caddy.Duration(d) }, MaxLockTTL, "24h"},
		{"retry_after", func(h *Handler, d time.Duration) { h.RetryAfter = caddy.Duration(d) }, MaxRetryAfter, "24h"},
	} {
		for _, d := range []time.Duration{c.max, c.max + 1, 100000 * 24 * time.Hour, time.Duration(math.MaxInt64)} {
			h := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"memory"}`)}
			c.set(h, d)
			if err := h.Provision(ctx); err != nil {
				t.Fatalf("%s %v: provision: %v", c.option, d, err)
			}
			err := h.Validate()
			switch {
			case d <= c.max && err != nil:
				t.Errorf("%s %v (the maximum): %v", c.option, d, err)
			case d > c.max && (err == nil || !strings.HasPrefix(err.Error(), c.option+": ") || !strings.HasSuffix(err.Error(), " is over the maximum of "+c.maxIs)):
				t.Errorf("%s %v: %v; want an error naming %s and its maximum", c.option, d, err, c.option)
			}
			_ = h.Cleanup()
		}
	}
}

// verifySangho checks a Sangho-Signature header through h's provider.
func verifySangho(h *Handler, header string, body []byte) error {
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Header.Set("Sangho-Signature", header)
	_, err := h.provider.Verify(r, body)
	return err
}

// TestDeprecatedVerifierShape: the JSON shape before v0.3,
// "verifier": {"scheme": ...}, still loads as that provider (its
// options kept), for one release; with "provider" as well it is refused.
func TestDeprecatedVerifierShape(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"memory"}`), KeyPrefix: "deprecated:",
		VerifierRaw: json.RawMessage(`{"scheme":"hmac","header":"X-Sig","id_field":"event_id"}`)}
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("the old shape: %v", err)
	}
	if h.provider.name != "hmac" || h.SignatureHeader != "X-Sig" || h.provider.idField != "event_id" {
		t.Fatalf("the old shape loaded provider %q, header %q, id field %q; want hmac, X-Sig, event_id", h.provider.name, h.SignatureHeader, h.provider.idField)
	}
	both := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"memory"}`), KeyPrefix: "deprecated2:",
		VerifierRaw: json.RawMessage(`{"scheme":"github"}`), ProviderRaw: json.RawMessage(`{"name":"github"}`)}
	if err := both.Provision(ctx); err == nil || !strings.HasPrefix(err.Error(), "verifier: deprecated, and provider is set too") {
		t.Fatalf("both shapes: %v, want an error naming verifier", err)
	}
	noScheme := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"memory"}`), KeyPrefix: "deprecated3:",
		VerifierRaw: json.RawMessage(`{"header":"X-Sig"}`)}
	if err := noScheme.Provision(ctx); err == nil || !strings.HasPrefix(err.Error(), `verifier: no "scheme"`) {
		t.Fatalf("old shape without a scheme: %v", err)
	}
	// The old shape's errors name the key written: verifier, not provider.
	unknown := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"memory"}`), KeyPrefix: "deprecated4:",
		VerifierRaw: json.RawMessage(`{"scheme":"nope"}`)}
	if err := unknown.Provision(ctx); err == nil || !strings.HasPrefix(err.Error(), `verifier (deprecated, read as "provider"): `) {
		t.Fatalf("old shape, unknown scheme: %v", err)
	}
	signingKey := &Handler{Secrets: []string{"whsk_c2VjcmV0"}, StoreRaw: json.RawMessage(`{"type":"memory"}`), KeyPrefix: "deprecated5:",
		VerifierRaw: json.RawMessage(`{"scheme":"standard_webhooks"}`)}
	if err := signingKey.Provision(ctx); err == nil || !strings.HasPrefix(err.Error(), `verifier (deprecated, read as "provider") standard_webhooks: secret #1 `) {
		t.Fatalf("old shape, a secret its provider refuses: %v", err)
	}
}

// TestRetentionCoversTheSignatureWindow: with a provider that signs a
// timestamp, a retention shorter than the time a signature stays valid
// (tolerance either way: 2×tolerance) is refused, naming both: a
// captured delivery replayed once its done record expired, its
// signature still valid, would be processed again. (Found by review:
// stripe with retention 1s, the same delivery sent twice 1.5 s apart,
// was processed twice.) A provider without timestamps has no such
// window; a retention of 2×tolerance is accepted.
func TestRetentionCoversTheSignatureWindow(t *testing.T) {
	for _, c := range []struct {
		provider  string
		retention time.Duration
		tolerance time.Duration
		refused   bool
	}{
		{`{"name":"stripe"}`, time.Second, 0, true},
		{`{"name":"sangho"}`, 9 * time.Minute, 0, true},
		{`{"name":"standard_webhooks"}`, time.Minute, 0, true},
		{`{"name":"hmac","header":"X-Sig","timestamp_header":"X-Ts","id_field":"id","signed_content":"{timestamp}.{body}"}`, time.Minute, 0, true},
		{`{"name":"stripe"}`, 10 * time.Minute, 0, false},
		{`{"name":"stripe"}`, time.Minute, 30 * time.Second, false},
		{`{"name":"github"}`, time.Second, 0, false},
	} {
		secret := secret1
		if strings.Contains(c.provider, "standard_webhooks") {
			secret = swSecret1
		}
		h := &Handler{Secrets: []string{secret}, ProviderRaw: json.RawMessage(c.provider), StoreRaw: json.RawMessage(`{"type":"memory"}`),
			Retention: caddy.Duration(c.retention), Tolerance: caddy.Duration(c.tolerance), KeyPrefix: testPrefix(t) + ":"}
		err := validateProvisioned(t, h)
		if !c.refused {
			if err != nil {
				t.Errorf("%s retention %v tolerance %v: %v", c.provider, c.retention, c.tolerance, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "retention") || !strings.Contains(err.Error(), "tolerance") {
			t.Errorf("%s retention %v: %v, want an error naming retention and tolerance", c.provider, c.retention, err)
		}
	}
}

// TestSubSecondDurationsRefused: in JSON a duration given as a bare
// number is nanoseconds, so "retention": 259200 (meant as seconds) is
// 259 µs, and "tolerance": 300 is 300 ns, which refuses every delivery.
// Both validated (found by the configuration review: github with 259 µs
// of retention processed every resend again). Under a second, tolerance
// and retention are refused, naming the option and the JSON rule.
func TestSubSecondDurationsRefused(t *testing.T) {
	for _, c := range []struct {
		provider, field string
		set             func(*Handler)
	}{
		{`{"name":"github"}`, "retention", func(h *Handler) { h.Retention = 259200 }},
		{`{"name":"shopify"}`, "retention", func(h *Handler) { h.Retention = caddy.Duration(999 * time.Millisecond) }},
		{`{"name":"stripe"}`, "tolerance", func(h *Handler) { h.Tolerance = 300 }},
		{`{"name":"sangho"}`, "tolerance", func(h *Handler) { h.Tolerance = caddy.Duration(500 * time.Millisecond) }},
	} {
		h := &Handler{Secrets: []string{secret1}, ProviderRaw: json.RawMessage(c.provider), StoreRaw: json.RawMessage(`{"type":"memory"}`),
			KeyPrefix: testPrefix(t) + ":"}
		c.set(h)
		err := validateProvisioned(t, h)
		tiny := c.field == "retention" && h.Retention < caddy.Duration(time.Millisecond) || c.field == "tolerance" && h.Tolerance < caddy.Duration(time.Millisecond)
		if err == nil || !strings.HasPrefix(err.Error(), c.field+":") || !strings.Contains(err.Error(), "under the minimum of 1s") || strings.Contains(err.Error(), "nanoseconds") != tiny {
			t.Errorf("%s %s: %v, want it refused, naming %s and the minimum, and JSON's nanoseconds if under 1 ms", c.provider, c.field, err, c.field)
		}
	}
	// A second is accepted (github has no signature window).
	h := &Handler{Secrets: []string{secret1}, ProviderRaw: json.RawMessage(`{"name":"github"}`), StoreRaw: json.RawMessage(`{"type":"memory"}`),
		KeyPrefix: testPrefix(t) + ":", Retention: caddy.Duration(time.Second)}
	if err := validateProvisioned(t, h); err != nil {
		t.Errorf("github, retention 1s: %v", err)
	}
}

// validateProvisioned provisions h (a failure ends the test), and
// returns what Validate says, h cleaned up.
func validateProvisioned(t *testing.T, h *Handler) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	defer h.Cleanup()
	return h.Validate()
}
