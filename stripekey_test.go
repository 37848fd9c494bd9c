package sanghodedup

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestStripeSecretNotASigningSecret: Stripe signs with the endpoint's
// signing secret, whsec_…; a secret or restricted API key (sk_, rk_)
// given in its place was taken, and every delivery refused 401 (found
// by the configuration review). An API key is refused at load, naming
// the secret's place, not its value; any other secret without whsec_
// warns.
func TestStripeSecretNotASigningSecret(t *testing.T) {
	for _, key := range []string{"sk_live_51HxYzAbCdEf", "rk_test_51HxYzAbCdEf", "sk_test_x"} {
		h := &Handler{Secrets: []string{secret1, key}, ProviderRaw: json.RawMessage(`{"name":"stripe"}`), StoreRaw: json.RawMessage(`{"type":"memory"}`)}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		_ = h.Cleanup()
		cancel()
		if err == nil || !strings.Contains(err.Error(), "secret #2") || !strings.Contains(err.Error(), "API key") || strings.Contains(err.Error(), key) {
			t.Errorf("stripe with %.7s…: %v, want it refused, naming secret #2 and not its value", key, err)
		}
	}
	all, text := warnedAtLoad(t, "\tsangho_dedup {\n\t\tprovider stripe\n\t\tsecret "+secret1+" not_a_signing_secret\n\t\tstore memory\n\t}\n\trespond 200\n",
		"secret is not a Stripe signing secret")
	warned := len(all) == 1 && all[0]["secret"] == float64(2)
	if !warned || strings.Contains(text, "not_a_signing_secret") {
		t.Errorf("a stripe secret without whsec_: warned %v, want a warning naming secret 2 and not its value; log:\n%s", warned, text)
	}
}
