package sanghodedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/sat"
)

// errSigReplayed refuses a signed message already accepted with another
// event ID (see bindSignature).
var errSigReplayed = errors.New("this signature was already accepted with another event ID (replay through the unsigned event ID header)")

// provider is the handler's view of its signature provider, settled at
// provision.
type provider struct {
	dedup.Provider
	name       string // the module's name, e.g. "github"
	defaults   dedup.ProviderDefaults
	idSource   dedup.IDSource
	idField    string   // dedup.IDFromBody
	idHeaders  []string // canonical; dedup.IDFromHeader: the ID's; dedup.IDFromBody: the first must agree
	typeHeader string   // canonical, or ""
	timestamp  bool     // the provider signs a timestamp
}

// Errors of the headers a delivery is read from. A header sent more
// than once is refused (which value would a backend read?): the
// signature's is answered 401, the event ID's 400.
var (
	errIDHeaders       = errors.New("more than one event ID header")
	errIDHeaderMissing = errors.New("no event ID: the event ID header is absent")
)

// eventOf returns the event ID and type of a verified delivery, from
// where the provider says.
func (h *Handler) eventOf(r *http.Request, body []byte, vd *dedup.Verified) (event, error) {
	s := &h.provider
	switch s.idSource {
	case dedup.IDFromSignedHeader:
		if !validID(vd.ID) {
			return event{}, errIDInvalid
		}
		return event{id: vd.ID, typ: s.typeOf(r, body)}, nil
	case dedup.IDFromHeader:
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
// the body: the provider's type header, else the body's top-level "type"
// when the body is a well-formed JSON object (best effort: a body the
// scanner refuses just has no type here).
func (s *provider) typeOf(r *http.Request, body []byte) string {
	if s.typeHeader != "" {
		return r.Header.Get(s.typeHeader)
	}
	f, err := scanTopLevelKey(body, "id")
	if err != nil {
		return ""
	}
	return f.typ
}

// setupProvider settles the provider: the effective headers and tolerance
// (the handler's options over the provider's defaults), then Init with the
// resolved secrets.
func (h *Handler) setupProvider(v dedup.Provider, name string, secrets []string) error {
	d := v.Defaults()
	s := provider{Provider: v, name: name, defaults: d, idSource: d.IDSource, idField: d.IDField, timestamp: d.Tolerance > 0}
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
	h.provider = s
	// Without a signed ID the signed message is bound to the ID it
	// first came with (see bindSignature); only then does the handler
	// need what the signature covers.
	unsignedID := s.idSource == dedup.IDFromHeader || s.idSource == dedup.IDFromBody && !h.requireBodyID && len(s.idHeaders) > 0
	// A signature is valid while the clock is within tolerance of its
	// timestamp: at most 2×tolerance after it was first accepted (+1 s
	// for whole seconds). Without a signed timestamp a signature never
	// expires, so it is remembered as long as the event is. Validate
	// bounds tolerance; the sum saturates anyway, since a negative one
	// would switch the binding off.
	h.sigMemory = sat.Add(sat.Add(time.Duration(h.Tolerance), time.Duration(h.Tolerance)), time.Second)
	if !s.timestamp {
		h.sigMemory = time.Duration(h.Retention)
	}
	return v.Init(dedup.ProviderConfig{
		Secrets:         secrets,
		SignatureHeader: h.SignatureHeader,
		EventIDHeaders:  s.idHeaders,
		Tolerance:       time.Duration(h.Tolerance),
		SignedContent:   unsignedID,
		Now:             h.now,
	})
}

// validateProvider checks the options that depend on the provider.
func (h *Handler) validateProvider() error {
	s := &h.provider
	switch {
	case !s.timestamp && h.Tolerance != 0:
		return fmt.Errorf("tolerance: the %s provider signs no timestamp, so there is no tolerance to set (a captured delivery stays valid: see docs/providers.md)", s.name)
	case h.RequireBodyID != nil && s.idSource != dedup.IDFromBody:
		return fmt.Errorf("require_body_id: applies only where the event ID comes from the body (sangho, stripe, hmac with id_field); the %s provider takes it from a %s", s.name, s.idSource)
	case h.SignatureHeader == "":
		return fmt.Errorf("signature_header: the %s provider has no default signature header: give one", s.name)
	case s.idSource == dedup.IDFromHeader && len(s.idHeaders) == 0:
		return fmt.Errorf("event_id_header: the %s provider takes the event ID from a header and has no default one: give one", s.name)
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
// (2×tolerance+1s), or retention when the provider signs no timestamp, and
// it becomes a durable done record when the event is processed (see
// commitSignature). On a refusal or a store error the event's own lease
// is released before returning.
func (d *delivery) bindSignature() error {
	h := d.h
	start := time.Now()
	res, found, err := h.store.Claim(d.ctx, d.sigKey, d.id, h.sigMemory)
	observe(opClaim, start, err)
	// Reclaimed: the binding's time (sigMemory) ran out without a commit,
	// and the store keeps it as a mark; a binding lasts sigMemory, no
	// more, so the message is bound to this ID now.
	if err == nil && (res == dedup.Claimed || res == dedup.Reclaimed) {
		return nil
	}
	// A done record of this same ID: the event was processed, then
	// forgotten by an operator (GitHub's manual redelivery reuses the
	// delivery ID), and is let through again.
	if rec, ok := dedup.DecodeDone(found); err == nil && res == dedup.AlreadyDone && ok && replayRecordOf(rec) == d.id {
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
// a done record, owned by the event ID, for sigMemory. A failure leaves
// the lease, which keeps refusing replays until it expires, and is
// logged.
func (d *delivery) commitSignature(ctx context.Context, rec dedup.DoneRecord) {
	// The record names the event ID that owns the signature.
	rec.EventID = d.id
	start := time.Now()
	_, err := d.h.store.Commit(ctx, d.sigKey, d.id, rec, d.h.sigMemory)
	observe(opCommit, start, err)
	if err != nil {
		d.h.logger.Warn("signature record commit failed", zap.String("event_id", d.id), zap.Error(err))
	}
}

// replayRecordOf is the event ID a signature's replay record names:
// its event_id, or, in a record written before v0.3, its event_type
// (which held the ID there).
func replayRecordOf(rec dedup.DoneRecord) string {
	if rec.EventID != "" {
		return rec.EventID
	}
	return rec.EventType
}
