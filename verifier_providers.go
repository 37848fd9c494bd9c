package sanghodedup

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() {
	caddy.RegisterModule(GitHubScheme{})
	caddy.RegisterModule(ShopifyScheme{})
}

// GitHubScheme verifies GitHub's webhook signatures: header
// X-Hub-Signature-256 `sha256=<hex>`, the HMAC-SHA256 of the raw body
// keyed with the webhook's secret taken as bytes. The event ID is the
// X-GitHub-Delivery header (a GUID), which the signature does not cover;
// the event type is X-GitHub-Event. GitHub signs no timestamp, so a
// signature never expires: the handler remembers each accepted signed
// body with the delivery ID it came with, for retention, and answers its
// replay under another ID 401. No options.
type GitHubScheme struct{ mac macScheme }

// ShopifyScheme verifies Shopify's webhook signatures: header
// X-Shopify-Hmac-Sha256, the base64 HMAC-SHA256 of the raw body keyed
// with the app's client secret taken as bytes. The event ID is the
// X-Shopify-Event-Id header (Shopify's own advice for deduplication),
// else X-Shopify-Webhook-Id; neither is signed. The event type is
// X-Shopify-Topic. No signed timestamp: as for github, each accepted
// signed body is remembered with its event ID, for retention, and its
// replay under another ID is answered 401. No options.
type ShopifyScheme struct{ mac macScheme }

// CaddyModule returns the Caddy module information.
func (GitHubScheme) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.verifiers.github",
		New: func() caddy.Module { return new(GitHubScheme) },
	}
}

// CaddyModule returns the Caddy module information.
func (ShopifyScheme) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.verifiers.shopify",
		New: func() caddy.Module { return new(ShopifyScheme) },
	}
}

// Defaults implements Verifier.
func (*GitHubScheme) Defaults() SchemeDefaults {
	return SchemeDefaults{
		SignatureHeader: "X-Hub-Signature-256",
		EventIDHeaders:  []string{"X-GitHub-Delivery"},
		IDSource:        IDFromHeader,
		EventTypeHeader: "X-GitHub-Event",
	}
}

// Defaults implements Verifier.
func (*ShopifyScheme) Defaults() SchemeDefaults {
	return SchemeDefaults{
		SignatureHeader: "X-Shopify-Hmac-Sha256",
		EventIDHeaders:  []string{"X-Shopify-Event-Id", "X-Shopify-Webhook-Id"},
		IDSource:        IDFromHeader,
		EventTypeHeader: "X-Shopify-Topic",
	}
}

// Init implements Verifier.
func (s *GitHubScheme) Init(c VerifierConfig) error {
	s.mac = macScheme{prefix: "sha256="}
	_ = s.mac.setAlgorithm("sha256", "hex")
	_ = s.mac.parseTemplate("{body}")
	return s.mac.init(c)
}

// Init implements Verifier.
func (s *ShopifyScheme) Init(c VerifierConfig) error {
	s.mac = macScheme{}
	_ = s.mac.setAlgorithm("sha256", "base64")
	_ = s.mac.parseTemplate("{body}")
	return s.mac.init(c)
}

// Verify implements Verifier.
func (s *GitHubScheme) Verify(r *http.Request, body []byte) (Verified, error) {
	return s.mac.verify(r, body)
}

// Verify implements Verifier.
func (s *ShopifyScheme) Verify(r *http.Request, body []byte) (Verified, error) {
	return s.mac.verify(r, body)
}

// UnmarshalCaddyfile accepts `provider github` with no arguments or block.
func (*GitHubScheme) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return noOptions(d) }

// UnmarshalCaddyfile accepts `provider shopify` with no arguments or block.
func (*ShopifyScheme) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return noOptions(d) }

// Interface guards
var (
	_ Verifier              = (*GitHubScheme)(nil)
	_ Verifier              = (*ShopifyScheme)(nil)
	_ caddyfile.Unmarshaler = (*GitHubScheme)(nil)
	_ caddyfile.Unmarshaler = (*ShopifyScheme)(nil)
)
