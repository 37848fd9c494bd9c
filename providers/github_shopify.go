package providers

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

func init() {
	caddy.RegisterModule(GitHub{})
	caddy.RegisterModule(Shopify{})
}

// GitHub verifies GitHub's webhook signatures: header
// X-Hub-Signature-256 `sha256=<hex>`, the HMAC-SHA256 of the raw body
// keyed with the webhook's secret taken as bytes. The event ID is the
// X-GitHub-Delivery header (a GUID), which the signature does not cover;
// the event type is X-GitHub-Event. GitHub signs no timestamp, so a
// signature never expires: the handler remembers each accepted signed
// body with the delivery ID it came with, for retention, and answers its
// replay under another ID 401. No options.
type GitHub struct{ mac macEngine }

// Shopify verifies Shopify's webhook signatures: header
// X-Shopify-Hmac-Sha256, the base64 HMAC-SHA256 of the raw body keyed
// with the app's client secret taken as bytes. The event ID is the
// X-Shopify-Event-Id header (Shopify's own advice for deduplication),
// else X-Shopify-Webhook-Id; neither is signed. The event type is
// X-Shopify-Topic. No signed timestamp: as for github, each accepted
// signed body is remembered with its event ID, for retention, and its
// replay under another ID is answered 401. No options.
type Shopify struct{ mac macEngine }

// CaddyModule returns the Caddy module information.
func (GitHub) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.providers.github",
		New: func() caddy.Module { return new(GitHub) },
	}
}

// CaddyModule returns the Caddy module information.
func (Shopify) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.providers.shopify",
		New: func() caddy.Module { return new(Shopify) },
	}
}

// Defaults implements Verifier.
func (*GitHub) Defaults() dedup.ProviderDefaults {
	return dedup.ProviderDefaults{
		SignatureHeader: "X-Hub-Signature-256",
		EventIDHeaders:  []string{"X-GitHub-Delivery"},
		IDSource:        dedup.IDFromHeader,
		EventTypeHeader: "X-GitHub-Event",
		// GitHub caps payloads at 25 MB, and does not redeliver a
		// delivery that failed (413 included) by itself.
		MaxBodySize: 25 << 20,
	}
}

// Defaults implements Verifier.
func (*Shopify) Defaults() dedup.ProviderDefaults {
	return dedup.ProviderDefaults{
		SignatureHeader: "X-Shopify-Hmac-Sha256",
		EventIDHeaders:  []string{"X-Shopify-Event-Id", "X-Shopify-Webhook-Id"},
		IDSource:        dedup.IDFromHeader,
		EventTypeHeader: "X-Shopify-Topic",
	}
}

// Init implements Verifier.
func (s *GitHub) Init(c dedup.ProviderConfig) error {
	s.mac = macEngine{prefix: "sha256="}
	_ = s.mac.setAlgorithm("sha256", "hex")
	_ = s.mac.parseTemplate("{body}")
	return s.mac.init(c)
}

// Init implements Verifier.
func (s *Shopify) Init(c dedup.ProviderConfig) error {
	s.mac = macEngine{}
	_ = s.mac.setAlgorithm("sha256", "base64")
	_ = s.mac.parseTemplate("{body}")
	return s.mac.init(c)
}

// Verify implements Verifier.
func (s *GitHub) Verify(r *http.Request, body []byte) (dedup.Verified, error) {
	return s.mac.verify(r, body)
}

// Verify implements Verifier.
func (s *Shopify) Verify(r *http.Request, body []byte) (dedup.Verified, error) {
	return s.mac.verify(r, body)
}

// UnmarshalCaddyfile accepts `provider github` with no arguments or block.
func (*GitHub) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return noOptions(d) }

// UnmarshalCaddyfile accepts `provider shopify` with no arguments or block.
func (*Shopify) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return noOptions(d) }

// Interface guards
var (
	_ dedup.Provider        = (*GitHub)(nil)
	_ dedup.Provider        = (*Shopify)(nil)
	_ caddyfile.Unmarshaler = (*GitHub)(nil)
	_ caddyfile.Unmarshaler = (*Shopify)(nil)
)
