package providers

import (
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
)

func init() {
	caddy.RegisterModule(Sangho{})
	caddy.RegisterModule(Stripe{})
}

// Sangho verifies Sangho's signatures, the default provider:
// header Sangho-Signature `t=<unix seconds>,v1=<hex>[,v1=<hex>...]`,
// each v1 the hex HMAC-SHA256 of `<t>.<body>` keyed with a secret taken
// as bytes, whole (whsec_ included); pairs with other keys are ignored.
// The event ID is the signed body's top-level "id"; the
// Sangho-Event-ID header must agree with it (and stands in for it only
// with require_body_id off). Default tolerance 5m. No options.
type Sangho struct{ tsHMAC }

// Stripe verifies Stripe's signatures: header Stripe-Signature,
// the same `t=...,v1=...` format as Sangho's (v0 and other schemes are
// ignored), secrets (whsec_...) taken as bytes, whole. The event ID is
// the signed body's top-level "id" (Stripe's events always carry one;
// Stripe sends no event ID header). Default tolerance 5m, as Stripe's
// libraries. No options.
type Stripe struct{ tsHMAC }

// CaddyModule returns the Caddy module information.
func (Sangho) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.providers.sangho",
		New: func() caddy.Module { return new(Sangho) },
	}
}

// CaddyModule returns the Caddy module information.
func (Stripe) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.providers.stripe",
		New: func() caddy.Module { return new(Stripe) },
	}
}

// Defaults implements Verifier.
func (*Sangho) Defaults() dedup.ProviderDefaults {
	return dedup.ProviderDefaults{
		SignatureHeader: SanghoSignatureHeader,
		EventIDHeaders:  []string{SanghoEventIDHeader},
		IDSource:        dedup.IDFromBody,
		Tolerance:       DefaultTolerance,
	}
}

// Defaults implements Verifier.
func (*Stripe) Defaults() dedup.ProviderDefaults {
	return dedup.ProviderDefaults{
		SignatureHeader: "Stripe-Signature",
		IDSource:        dedup.IDFromBody,
		Tolerance:       DefaultTolerance,
	}
}

// UnmarshalCaddyfile accepts `provider sangho` with no arguments or block.
func (*Sangho) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return noOptions(d)
}

// UnmarshalCaddyfile accepts `provider stripe` with no arguments or block.
func (*Stripe) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return noOptions(d)
}

// noOptions accepts a provider line with no arguments and no block. The
// handler's parser prefixes its errors with "provider <name>: ".
func noOptions(d *caddyfile.Dispenser) error {
	d.Next() // provider name
	if d.NextArg() {
		// The value is not quoted: it is often a secret put on the wrong
		// line (provider stripe whsec_...).
		return d.Err("takes no arguments (a secret goes in secret)")
	}
	return cfargs.NoBlock(d)
}

// tsHMAC is the `t=<unix>,v1=<hex>` engine of Sangho and Stripe.
type tsHMAC struct {
	header        string
	engine        *sanghoEngine
	signedContent bool
}

// Init implements Verifier.
func (s *tsHMAC) Init(c dedup.ProviderConfig) error {
	s.header = c.SignatureHeader
	s.engine = newSanghoEngine(c.Secrets, c.Tolerance, c.Now)
	s.signedContent = c.SignedContent
	return nil
}

// Verify implements Verifier.
func (s *tsHMAC) Verify(r *http.Request, body []byte) (dedup.Verified, error) {
	sig, err := headerValue(r.Header, s.header)
	if err != nil {
		return dedup.Verified{}, ErrSignatureCount
	}
	t, err := s.engine.check(sig, body)
	if err != nil {
		return dedup.Verified{}, err
	}
	var vd dedup.Verified
	if s.signedContent {
		vd.Before = append(strconv.AppendInt(make([]byte, 0, 20), t, 10), '.')
	}
	return vd, nil
}

// Interface guards
var (
	_ dedup.Provider        = (*Sangho)(nil)
	_ dedup.Provider        = (*Stripe)(nil)
	_ caddyfile.Unmarshaler = (*Sangho)(nil)
	_ caddyfile.Unmarshaler = (*Stripe)(nil)
)
