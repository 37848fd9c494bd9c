// Package senders signs deliveries as each provider's sender does, with
// the sender's own library where it has one (Stripe's, Standard
// Webhooks'), for the tests of the root and of providers. Those libraries
// are test-only dependencies: only tests import this package
// (TestTestOnlyModulesStayOutOfTheBinary keeps them out of ./cmd/caddy).
package senders

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stripe/stripe-go/v82/webhook"
)

// Secrets of the provider tests. Standard Webhooks secrets are whsec_
// and base64 (SWSecret1 is the spec libraries' test secret); ShopSecret1
// is the secret of Shopify's own library's test vector.
const (
	SWSecret1    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	SWSecret2    = "whsec_dGhlIHNlY29uZCBzZWNyZXQsIGZvciByb3RhdGlvbg=="
	GHSecret1    = "It's a Secret to Everybody"
	GHSecret2    = "gh_rotated_secret_2"
	ShopSecret1  = "test_secret_key"
	ShopSecret2  = "shpss_rotated_secret_2"
	StripeSecret = "whsec_stripe_test_1"
)

// StripeHeader signs body at t with Stripe's own library: the
// Stripe-Signature value, one v1 per secret (as Stripe does while a
// secret is rolled).
func StripeHeader(at time.Time, body string, secrets ...string) string {
	h := ""
	for _, s := range secrets {
		p := webhook.GenerateTestSignedPayload(&webhook.UnsignedPayload{Payload: []byte(body), Secret: s, Timestamp: at})
		if h == "" {
			h = p.Header
		} else {
			h += ",v1=" + hex.EncodeToString(p.Signature)
		}
	}
	return h
}

// StandardWebhooks signs with the Standard Webhooks library: it sets the
// webhook-* headers, one signature per secret, space-separated.
func StandardWebhooks(t testing.TB, h http.Header, id string, at time.Time, body string, secrets ...string) {
	t.Helper()
	var sigs []string
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := wh.Sign(id, at, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		sigs = append(sigs, sig)
	}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	h.Set("webhook-signature", strings.Join(sigs, " "))
}

// GitHub signs as GitHub does: the X-Hub-Signature-256 value. GitHub's
// Go library only validates, so the provider tests check what this
// produces with it (and against GitHub's documented example).
func GitHub(body, secret string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Shopify signs as Shopify does: the X-Shopify-Hmac-Sha256 value
// (checked against the vector of Shopify's own library in the provider
// tests).
func Shopify(body, secret string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(body))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
