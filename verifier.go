package sanghodedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// Verifier is a signature scheme: it checks that a delivery was signed
// by its sender, and says where the event ID comes from. A scheme is a
// Caddy module in the namespace http.sangho_dedup.verifiers (JSON
// "verifier": {"scheme": "<name>", ...}), so another plugin can add a
// provider without touching this one. The handler calls Defaults once,
// then Init once, both during its Provision, then Verify for every
// delivery, concurrently.
type Verifier interface {
	// Defaults returns the scheme's defaults: the handler's options
	// signature_header, event_id_header and tolerance override them.
	// Called after the module's own provisioning, so it may depend on
	// the module's configuration.
	Defaults() SchemeDefaults

	// Init gives the scheme the handler's resolved secrets and effective
	// settings. An error is a config error: it must name the option (a
	// secret by its number, "secret #2"), never print a secret.
	Init(VerifierConfig) error

	// Verify checks the signature of one delivery; body is the whole
	// request body, which Verify must not keep or change. Any error is
	// answered 401 and logged (at debug level): it must not hold a secret
	// or a signature value.
	Verify(r *http.Request, body []byte) (Verified, error)
}

// IDSource says where a scheme takes the event ID from.
type IDSource int

const (
	// IDFromBody: the ID is a top-level string field of the signed JSON
	// body (SchemeDefaults.IDField). An event ID header, when the scheme
	// names one, must agree with it, and stands in for it only with
	// require_body_id off (the header is not signed).
	IDFromBody IDSource = iota
	// IDFromSignedHeader: the ID is in a header that the signature
	// covers; Verify returns it in Verified.ID.
	IDFromSignedHeader
	// IDFromHeader: the ID is in a header that the signature does not
	// cover (the first of SchemeDefaults.EventIDHeaders that is present).
	// A captured delivery could be replayed under another ID: the
	// handler remembers each accepted signed message with the ID it came
	// with (see the handler's require_body_id).
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

// SchemeDefaults describes a scheme to the handler.
type SchemeDefaults struct {
	// SignatureHeader is the header that carries the signature; the
	// handler's signature_header overrides it. "" means the scheme has
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
	// clock by default; 0 means the scheme signs no timestamp (then the
	// handler refuses a tolerance, and a signature never expires).
	Tolerance time.Duration
}

// VerifierConfig is what the handler gives a scheme at Init.
type VerifierConfig struct {
	// Secrets, resolved (placeholders replaced), at least one. What a
	// secret is (bytes, base64, a public key) is the scheme's to say.
	Secrets []string

	// SignatureHeader, EventIDHeaders and Tolerance are the effective
	// settings: the scheme's defaults unless overridden. Header names are
	// canonical (http.CanonicalHeaderKey).
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
	// ID is the event ID when the scheme takes it from a header that the
	// signature covers (IDFromSignedHeader); else "".
	ID string

	// Before and After are what the signature covers around the body:
	// the signed message is Before, the body, After. Filled only when
	// VerifierConfig.SignedContent asked for them; the handler keys its
	// replay record on their SHA-256 with the body's, so they must not
	// depend on which secret or which signature matched.
	Before, After []byte
}

// Errors shared by the schemes. None carries a secret or a signature.
var (
	errSigPrefix   = errors.New("signature does not start with the expected prefix")
	errSigEncoding = errors.New("signature is not valid for the expected encoding and hash length")
)

// scheme is the handler's view of its signature scheme, settled at
// provision.
type scheme struct {
	Verifier
	name       string // the module's name, e.g. "github"
	defaults   SchemeDefaults
	idSource   IDSource
	idField    string   // IDFromBody
	idHeaders  []string // canonical; IDFromHeader: the ID's; IDFromBody: the first must agree
	typeHeader string   // canonical, or ""
	timestamp  bool     // the scheme signs a timestamp
}

// Errors of the headers a delivery is read from. A header sent more
// than once is refused (which value would a backend read?): the
// signature's is answered 401, the event ID's 400.
var (
	errSigCount        = errors.New("more than one signature header")
	errIDHeaders       = errors.New("more than one event ID header")
	errIDHeaderMissing = errors.New("no event ID: the event ID header is absent")
)

// headerValue returns the one value of header name: "" and no error
// when it is absent, errSigCount when it is sent more than once (which
// one would a backend read?).
func headerValue(h http.Header, name string) (string, error) {
	vs := h[name]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("%w: %s", errSigCount, name)
}

// requireHeader is headerValue for a header that must be present and
// not empty.
func requireHeader(h http.Header, name string) (string, error) {
	v, err := headerValue(h, name)
	if err == nil && v == "" {
		err = fmt.Errorf("%w: %s", errSigMissing, name)
	}
	return v, err
}

// eventOf returns the event ID and type of a verified delivery, from
// where the scheme says.
func (h *Handler) eventOf(r *http.Request, body []byte, vd *Verified) (event, error) {
	s := &h.scheme
	switch s.idSource {
	case IDFromSignedHeader:
		if !validID(vd.ID) {
			return event{}, errIDInvalid
		}
		return event{id: vd.ID, typ: s.typeOf(r, body)}, nil
	case IDFromHeader:
		for _, name := range s.idHeaders {
			vs := r.Header[name]
			switch {
			case len(vs) == 0:
				continue
			case len(vs) > 1:
				return event{}, fmt.Errorf("%w: %s", errIDHeaders, name)
			case !validID(vs[0]):
				return event{}, errIDInvalid
			}
			return event{id: vs[0], typ: s.typeOf(r, body), fromHeader: true}, nil
		}
		return event{}, fmt.Errorf("%w (%s)", errIDHeaderMissing, strings.Join(s.idHeaders, ", "))
	}
	var headerIDs []string
	if len(s.idHeaders) > 0 {
		headerIDs = r.Header[s.idHeaders[0]]
	}
	ev, err := extractEventField(body, headerIDs, h.requireBodyID, s.idField)
	if s.typeHeader != "" {
		ev.typ = r.Header.Get(s.typeHeader)
	}
	return ev, err
}

// typeOf is the event type of a delivery whose ID does not come from
// the body: the scheme's type header, else the body's top-level "type"
// when the body is a well-formed JSON object (best effort: a body the
// scanner refuses just has no type here).
func (s *scheme) typeOf(r *http.Request, body []byte) string {
	if s.typeHeader != "" {
		return r.Header.Get(s.typeHeader)
	}
	f, err := scanTopLevelKey(body, "id")
	if err != nil {
		return ""
	}
	return f.typ
}

// setupScheme settles the scheme: the effective headers and tolerance
// (the handler's options over the scheme's defaults), then Init with the
// resolved secrets.
func (h *Handler) setupScheme(v Verifier, name string, secrets []string) error {
	d := v.Defaults()
	s := scheme{Verifier: v, name: name, defaults: d, idSource: d.IDSource, idField: d.IDField, timestamp: d.Tolerance > 0}
	if s.idField == "" {
		s.idField = "id"
	}
	if h.SignatureHeader == "" {
		h.SignatureHeader = d.SignatureHeader
	}
	h.SignatureHeader = http.CanonicalHeaderKey(h.SignatureHeader)
	if h.EventIDHeader != "" {
		h.EventIDHeader = http.CanonicalHeaderKey(h.EventIDHeader)
		s.idHeaders = []string{h.EventIDHeader}
	} else {
		for _, hd := range d.EventIDHeaders {
			s.idHeaders = append(s.idHeaders, http.CanonicalHeaderKey(hd))
		}
		if len(s.idHeaders) > 0 {
			h.EventIDHeader = s.idHeaders[0]
		}
	}
	if d.EventTypeHeader != "" {
		s.typeHeader = http.CanonicalHeaderKey(d.EventTypeHeader)
	}
	if h.Tolerance == 0 {
		h.Tolerance = caddy.Duration(d.Tolerance)
	}
	h.scheme = s
	// Without a signed ID the signed message is bound to the ID it
	// first came with (see bindSignature); only then does the handler
	// need what the signature covers.
	unsignedID := s.idSource == IDFromHeader || s.idSource == IDFromBody && !h.requireBodyID && len(s.idHeaders) > 0
	// A signature is valid while the clock is within tolerance of its
	// timestamp: at most 2×tolerance after it was first accepted (+1 s
	// for whole seconds). Without a signed timestamp a signature never
	// expires, so it is remembered as long as the event is. Validate
	// bounds tolerance; the sum saturates anyway, since a negative one
	// would switch the binding off.
	h.sigMemory = satAdd(satAdd(time.Duration(h.Tolerance), time.Duration(h.Tolerance)), time.Second)
	if !s.timestamp {
		h.sigMemory = time.Duration(h.Retention)
	}
	return v.Init(VerifierConfig{
		Secrets:         secrets,
		SignatureHeader: h.SignatureHeader,
		EventIDHeaders:  s.idHeaders,
		Tolerance:       time.Duration(h.Tolerance),
		SignedContent:   unsignedID,
		Now:             h.now,
	})
}

// satAdd is a + b for non-negative durations, saturating at the
// largest duration instead of wrapping negative.
func satAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// validateScheme checks the options that depend on the scheme.
func (h *Handler) validateScheme() error {
	s := &h.scheme
	switch {
	case !s.timestamp && h.Tolerance != 0:
		return fmt.Errorf("tolerance: the %s scheme signs no timestamp, so there is no tolerance to set (a captured delivery stays valid: see docs/providers.md)", s.name)
	case h.RequireBodyID != nil && s.idSource != IDFromBody:
		return fmt.Errorf("require_body_id: applies only where the event ID comes from the body (sangho, stripe, hmac with id_field); the %s scheme takes it from a %s", s.name, s.idSource)
	case h.SignatureHeader == "":
		return fmt.Errorf("signature_header: the %s scheme has no default signature header: give one", s.name)
	case s.idSource == IDFromHeader && len(s.idHeaders) == 0:
		return fmt.Errorf("event_id_header: the %s scheme takes the event ID from a header and has no default one: give one", s.name)
	}
	return nil
}

// signatureKey names the store record of a signed message: the SHA-256
// of what the signature covers (for Sangho t + "." + body, for GitHub
// the body), so that it does not depend on which secret or which
// signature matched. The ":" keeps it apart from event keys (an event ID
// has none).
func signatureKey(prefix string, before, body, after []byte) string {
	hash := sha256.New()
	hash.Write(before)
	hash.Write(body)
	hash.Write(after)
	var sum [sha256.Size]byte
	return prefix + "sig:" + hex.EncodeToString(hash.Sum(sum[:0]))
}

// bindSignature binds a signed message to the event ID it came with,
// when the signature does not cover the ID, so that a captured delivery
// replayed under another ID is refused (errSigReplayed, 401) instead of
// processed as a new event. It runs once this delivery holds the lease
// on its own event key, so a resent delivery of a processed event is a
// duplicate before it gets here. The record, key_prefix + "sig:" +
// SHA-256 of the signed message, is claimed as a lease whose token is
// the event ID: the same ID claims it again (a retry after a failure),
// another does not. It lives sigMemory: while the signature is valid
// (2×tolerance+1s), or retention when the scheme signs no timestamp, and
// it becomes a durable done record when the event is processed (see
// commitSignature). On a refusal or a store error the event's own lease
// is released before returning.
func (d *delivery) bindSignature() error {
	h := d.h
	start := time.Now()
	res, found, err := h.store.Claim(d.ctx, d.sigKey, d.id, h.sigMemory)
	observe(opClaim, start, err)
	if err == nil && res == Claimed {
		return nil
	}
	// A done record of this same ID: the event was processed, then
	// forgotten by an operator (GitHub's manual redelivery reuses the
	// delivery ID), and is let through again.
	if rec, ok := decodeDone(found); err == nil && res == AlreadyDone && ok && rec.EventType == d.id {
		return nil
	}
	if err == nil {
		err = errSigReplayed
	}
	if _, rerr := d.release(d.ctx); rerr != nil {
		h.logger.Warn("release failed", zap.String("event_id", d.id), zap.NamedError("cause", err),
			zap.Duration("lock_ttl", time.Duration(h.LockTTL)), zap.Error(rerr))
	}
	return err
}

// commitSignature turns the signature record of a processed event into
// a done record (durable on every store, where the lease is not: the
// file store keeps leases in memory), owned by the event ID, for
// sigMemory. A failure leaves the lease, which keeps refusing replays
// until it expires, and is logged.
func (d *delivery) commitSignature(ctx context.Context, rec DoneRecord) {
	// The record names the event ID that owns the signature, where an
	// event's record names its type.
	rec.EventType = d.id
	start := time.Now()
	_, err := d.h.store.Commit(ctx, d.sigKey, d.id, rec, d.h.sigMemory)
	observe(opCommit, start, err)
	if err != nil {
		d.h.logger.Warn("signature record commit failed", zap.String("event_id", d.id), zap.Error(err))
	}
}
