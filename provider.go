package sanghodedup

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/sat"
)

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
	case h.SignatureHeader == "" && s.name == "hmac":
		return errors.New("signature_header: the hmac provider has no default signature header: give its header (provider hmac { header <name> }), or signature_header")
	case h.SignatureHeader == "":
		return fmt.Errorf("signature_header: the %s provider has no default signature header: give one", s.name)
	case s.idSource == dedup.IDFromHeader && len(s.idHeaders) == 0 && s.name == "hmac":
		return errors.New("event_id_header: the hmac provider has no default event ID source: give its id_header (a header) or id_field (the JSON body's field), or event_id_header")
	case s.idSource == dedup.IDFromHeader && len(s.idHeaders) == 0:
		return fmt.Errorf("event_id_header: the %s provider takes the event ID from a header and has no default one: give one", s.name)
	}
	return nil
}
