package sanghodedup

import (
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() {
	caddy.RegisterModule(SanghoScheme{})
	caddy.RegisterModule(StripeScheme{})
}

// SanghoScheme verifies Sangho's signatures, the default scheme:
// header Sangho-Signature `t=<unix seconds>,v1=<hex>[,v1=<hex>...]`,
// each v1 the hex HMAC-SHA256 of `<t>.<body>` keyed with a secret taken
// as bytes, whole (whsec_ included); pairs with other keys are ignored.
// The event ID is the signed body's top-level "id"; the
// Sangho-Event-ID header must agree with it (and stands in for it only
// with require_body_id off). Default tolerance 5m. No options.
type SanghoScheme struct{ tsHMAC }

// StripeScheme verifies Stripe's signatures: header Stripe-Signature,
// the same `t=...,v1=...` format as Sangho's (v0 and other schemes are
// ignored), secrets (whsec_...) taken as bytes, whole. The event ID is
// the signed body's top-level "id" (Stripe's events always carry one;
// Stripe sends no event ID header). Default tolerance 5m, as Stripe's
// libraries. No options.
type StripeScheme struct{ tsHMAC }

// CaddyModule returns the Caddy module information.
func (SanghoScheme) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.verifiers.sangho",
		New: func() caddy.Module { return new(SanghoScheme) },
	}
}

// CaddyModule returns the Caddy module information.
func (StripeScheme) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.verifiers.stripe",
		New: func() caddy.Module { return new(StripeScheme) },
	}
}

// Defaults implements Verifier.
func (*SanghoScheme) Defaults() SchemeDefaults {
	return SchemeDefaults{
		SignatureHeader: DefaultSignatureHeader,
		EventIDHeaders:  []string{DefaultEventIDHeader},
		IDSource:        IDFromBody,
		Tolerance:       DefaultTolerance,
	}
}

// Defaults implements Verifier.
func (*StripeScheme) Defaults() SchemeDefaults {
	return SchemeDefaults{
		SignatureHeader: "Stripe-Signature",
		IDSource:        IDFromBody,
		Tolerance:       DefaultTolerance,
	}
}

// UnmarshalCaddyfile accepts `provider sangho` with no arguments or block.
func (*SanghoScheme) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return noOptions(d)
}

// UnmarshalCaddyfile accepts `provider stripe` with no arguments or block.
func (*StripeScheme) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return noOptions(d)
}

// noOptions accepts a provider line with no arguments and no block. The
// handler's parser prefixes its errors with "provider <name>: ".
func noOptions(d *caddyfile.Dispenser) error {
	d.Next() // scheme name
	if d.NextArg() {
		// The value is not quoted: it is often a secret put on the wrong
		// line (provider stripe whsec_...).
		return d.Err("takes no arguments (a secret goes in secret)")
	}
	if nesting := d.Nesting(); d.NextBlock(nesting) {
		return d.Errf("takes no options, found %q", d.Val())
	}
	return nil
}

// tsHMAC is the `t=<unix>,v1=<hex>` scheme of Sangho and Stripe.
type tsHMAC struct {
	header        string
	engine        *verifier
	signedContent bool
}

// Init implements Verifier.
func (s *tsHMAC) Init(c VerifierConfig) error {
	s.header = c.SignatureHeader
	s.engine = newVerifier(c.Secrets, c.Tolerance, c.Now)
	s.signedContent = c.SignedContent
	return nil
}

// Verify implements Verifier.
func (s *tsHMAC) Verify(r *http.Request, body []byte) (Verified, error) {
	sig, err := headerValue(r.Header, s.header)
	if err != nil {
		return Verified{}, errSigCount
	}
	t, err := s.engine.check(sig, body)
	if err != nil {
		return Verified{}, err
	}
	var vd Verified
	if s.signedContent {
		vd.Before = append(strconv.AppendInt(make([]byte, 0, 20), t, 10), '.')
	}
	return vd, nil
}

// sigEngine gives the handler (and its tests) the HMAC engine.
func (s *tsHMAC) sigEngine() *verifier { return s.engine }

// Interface guards
var (
	_ Verifier              = (*SanghoScheme)(nil)
	_ Verifier              = (*StripeScheme)(nil)
	_ caddyfile.Unmarshaler = (*SanghoScheme)(nil)
	_ caddyfile.Unmarshaler = (*StripeScheme)(nil)
)
