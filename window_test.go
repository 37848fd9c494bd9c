package sanghodedup

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRetentionUnderTheSendersWindowWarns: a retention shorter than the
// time a sender may still deliver an event again (its retries, or a
// redelivery its dashboard offers) gives up the promise for those late
// deliveries. It warned for sangho only (found by the configuration
// review: shopify with 1 s, stripe with 10 m, no word). Each sender whose
// window is known warns, with its window; hmac, whose sender is unknown,
// does not, nor does any at the default retention.
func TestRetentionUnderTheSendersWindowWarns(t *testing.T) {
	for _, c := range []struct {
		provider, secret, retention string
		window                      time.Duration // 0: no warning
	}{
		{"sangho", secret1, "24h", 48 * time.Hour},
		{"stripe", secret1, "48h", 72 * time.Hour},
		{"github", secret1, "24h", 72 * time.Hour},
		{"shopify", secret1, "1h", 4 * time.Hour},
		{"standard_webhooks", swSecret1, "12h", 28 * time.Hour},
		{"stripe", secret1, "72h", 0},
		{"shopify", secret1, "4h", 0},
		{"hmac {\n\t\t\theader X-Sig\n\t\t\tid_header X-Id\n\t\t}", secret1, "10m", 0},
	} {
		warned, text := warnedAtLoad(t, fmt.Sprintf("\tsangho_dedup {\n\t\tsecret %s\n\t\tprovider %s\n\t\tretention %s\n\t\tstore memory\n\t}\n\trespond 200\n", c.secret, c.provider, c.retention),
			"retention shorter than redelivery window")
		switch {
		case c.window == 0 && len(warned) > 0:
			t.Errorf("%s, retention %s: warned %v", c.provider, c.retention, warned)
		case c.window != 0 && (len(warned) != 1 || warned[0]["level"] != "warn" || warned[0]["redelivery_window"] != c.window.Seconds()):
			t.Errorf("%s, retention %s: want one warning with redelivery_window %v; log:\n%s", c.provider, c.retention, c.window, text)
		}
	}
}

// TestOnStoreErrorPassWarns: on_store_error pass gives up the promise
// while the store fails (each delivery then reaches the backend
// unchecked, its redeliveries too); like store memory, it says so at
// load (found by the configuration review: no word).
func TestOnStoreErrorPassWarns(t *testing.T) {
	for _, c := range []struct {
		option string
		warn   bool
	}{{"on_store_error pass", true}, {"on_store_error reject", false}, {"", false}} {
		warned, text := warnedAtLoad(t, "\tsangho_dedup {\n\t\tsecret "+secret1+"\n\t\t"+c.option+"\n\t}\n\trespond 200\n",
			"on_store_error pass: a failing store lets deliveries through unchecked")
		n := len(warned)
		if c.warn && n != 1 || !c.warn && n != 0 {
			t.Errorf("%q: %d warnings, want warned %v; log:\n%s", c.option, n, c.warn, text)
		}
	}
}

// TestSecretWithAControlCharacterWarns: a secret read from a file or the
// environment that keeps a line break (a file ending in two, a value
// pasted with one) signs nothing the sender sends: every delivery 401.
// It warns at load, naming the secret's place, never its value (found
// by the configuration review: no word).
func TestSecretWithAControlCharacterWarns(t *testing.T) {
	for _, c := range []struct {
		value string
		warn  bool
	}{{"whsec_ctl_test\n", true}, {"whsec_ctl\rtest", true}, {"whsec_ctl_test", false}, {"It's a Secret to Everybody", false}} {
		t.Setenv("SANGHO_DEDUP_TEST_CTL_SECRET", c.value)
		warned, text := warnedAtLoad(t, "\tsangho_dedup {\n\t\tsecret "+secret1+" {env.SANGHO_DEDUP_TEST_CTL_SECRET}\n\t\tstore memory\n\t}\n\trespond 200\n",
			"secret holds a control character")
		n := 0
		for _, e := range warned {
			if e["secret"] == float64(2) {
				n++
			}
		}
		if c.warn && n != 1 || !c.warn && n != 0 || strings.Contains(text, "ctl_test") {
			t.Errorf("%q: %d warnings, want warned %v, and no value in the log:\n%s", c.value, n, c.warn, text)
		}
	}
}
