package dedup

import (
	"errors"
	"net/http"
	"time"
)

// Provider is a sender's signing scheme: it checks that a delivery was
// signed by its sender, and says where the event ID comes from. A
// provider is a Caddy module in the namespace http.sangho_dedup.providers
// (Caddyfile `provider <name>`, JSON "provider": {"name": "<name>", ...}),
// so another plugin can add one without touching this one. The handler
// calls Defaults once, then Init once, both during its Provision, then
// Verify for every delivery, concurrently.
type Provider interface {
	// Defaults returns the provider's defaults: the handler's options
	// signature_header, event_id_header and tolerance override them.
	// Called after the module's own provisioning, so it may depend on
	// the module's configuration.
	Defaults() ProviderDefaults

	// Init gives the provider the handler's resolved secrets and
	// effective settings. An error is a config error: it must name the
	// option (a secret by its number, "secret #2"), never print a secret.
	Init(ProviderConfig) error

	// Verify checks the signature of one delivery; body is the whole
	// request body, which Verify must not keep or change. Any error is
	// answered 401 and logged (at debug level, and in the sampled warning
	// "signatures rejected"): it must not hold a secret
	// or a signature value. Wrapping one of the ErrSignature* errors
	// gives the reason label of the signature failure metric.
	Verify(r *http.Request, body []byte) (Verified, error)
}

// Why a signature is refused. A provider's error wraps one of these (or
// none: reason "other"). None carries a secret or a signature value.
var (
	ErrSignatureMissing   = errors.New("signature header missing")
	ErrSignatureMalformed = errors.New("signature header malformed")
	ErrSignatureTimestamp = errors.New("signature timestamp outside tolerance")
	ErrSignatureMismatch  = errors.New("no signature matches any configured secret")
)

// IDSource says where a provider takes the event ID from.
type IDSource int

const (
	// IDFromBody: the ID is a top-level string field of the signed JSON
	// body (ProviderDefaults.IDField). An event ID header, when the
	// provider names one, must agree with it, and stands in for it only
	// with require_body_id off (the header is not signed).
	IDFromBody IDSource = iota
	// IDFromSignedHeader: the ID is in a header that the signature
	// covers; Verify returns it in Verified.ID.
	IDFromSignedHeader
	// IDFromHeader: the ID is in a header that the signature does not
	// cover (the first of ProviderDefaults.EventIDHeaders that is
	// present). A captured delivery could be replayed under another ID:
	// the handler remembers each accepted signed message with the ID it
	// came with (see the handler's require_body_id).
	IDFromHeader
)

func (s IDSource) String() string {
	switch s {
	case IDFromBody:
		return "body"
	case IDFromSignedHeader:
		return "signed header"
	case IDFromHeader:
		return "header (not signed)"
	}
	return "unknown"
}

// ProviderDefaults describes a provider to the handler.
type ProviderDefaults struct {
	// SignatureHeader is the header that carries the signature; the
	// handler's signature_header overrides it. "" means the provider has
	// none by default, and then signature_header is required.
	SignatureHeader string

	// EventIDHeaders are the headers that carry the event ID, the first
	// present one wins; the handler's event_id_header replaces the whole
	// list. With IDFromBody the (first) header must agree with the body.
	EventIDHeaders []string

	// IDSource is where the event ID comes from; IDField the body field
	// for IDFromBody ("" means "id").
	IDSource IDSource
	IDField  string

	// EventTypeHeader, when set, is the header whose value is the event
	// type ({http.sangho_dedup.event_type}, the done record's
	// event_type); otherwise the type is the body's top-level "type".
	EventTypeHeader string

	// Tolerance is how far a signed timestamp may be from the server's
	// clock by default; 0 means the provider signs no timestamp (then the
	// handler refuses a tolerance, and a signature never expires).
	Tolerance time.Duration
	// MaxBodySize is the largest body the sender documents sending, when
	// it is over the handler's default (1 MiB): the handler's
	// max_body_size is this when not given (at most 64 MiB). 0: the
	// handler's default.
	MaxBodySize int64
}

// ProviderConfig is what the handler gives a provider at Init.
type ProviderConfig struct {
	// Secrets, resolved (placeholders replaced), at least one. What a
	// secret is (bytes, base64, a public key) is the provider's to say.
	Secrets []string

	// SignatureHeader, EventIDHeaders and Tolerance are the effective
	// settings: the provider's defaults unless overridden. Header names
	// are canonical (http.CanonicalHeaderKey).
	SignatureHeader string
	EventIDHeaders  []string
	Tolerance       time.Duration

	// SignedContent asks Verify to fill Verified.Before and After: the
	// handler needs them when the event ID may come from a header that
	// the signature does not cover.
	SignedContent bool

	// Now is the clock to compare signed timestamps with.
	Now func() time.Time
}

// Verified is what Verify learned of a delivery with a valid signature.
type Verified struct {
	// ID is the event ID when the provider takes it from a header that
	// the signature covers (IDFromSignedHeader); else "".
	ID string

	// Before and After are what the signature covers around the body:
	// the signed message is Before, the body, After. Filled only when
	// ProviderConfig.SignedContent asked for them; the handler keys its
	// replay record on their SHA-256 with the body's, so they must not
	// depend on which secret or which signature matched.
	Before, After []byte
}
