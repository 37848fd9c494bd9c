package providers

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

func init() {
	caddy.RegisterModule(StandardWebhooks{})
}

// StandardWebhooks verifies the Standard Webhooks signature
// (www.standardwebhooks.com; Svix and the senders that adopt the spec):
// headers webhook-id, webhook-timestamp (Unix seconds) and
// webhook-signature, or, each where the webhook- one is absent, Svix's
// svix-id, svix-timestamp and svix-signature. The signature header is a
// space-separated list of `<version>,<base64>` entries, any of which may
// match: v1 is the HMAC-SHA256 of `<id>.<timestamp>.<body>` keyed with
// the base64-decoded part of a `whsec_<base64>` secret; v1a is an
// Ed25519 signature of the same content, checked with a `whpk_<base64>`
// public key given as a secret. Other versions are ignored. The event ID
// is the webhook-id, which the signature covers. Default tolerance 5m,
// as the spec's libraries. No options.
type StandardWebhooks struct {
	idHeaders     []string // the ID header, then Svix's when the default is used
	tsHeaders     []string
	sigHeaders    []string
	tolerance     time.Duration
	now           func() time.Time
	macs          []*sync.Pool // one per whsec_ key, each yielding hash.Hash
	publicKeys    []ed25519.PublicKey
	signedContent bool
}

// Standard Webhooks' header names, canonical.
const (
	swID        = "Webhook-Id"
	swTimestamp = "Webhook-Timestamp"
	swSignature = "Webhook-Signature"
)

// CaddyModule returns the Caddy module information.
func (StandardWebhooks) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.providers.standard_webhooks",
		New: func() caddy.Module { return new(StandardWebhooks) },
	}
}

// Defaults implements Verifier.
func (*StandardWebhooks) Defaults() dedup.ProviderDefaults {
	return dedup.ProviderDefaults{
		SignatureHeader: swSignature,
		EventIDHeaders:  []string{swID},
		IDSource:        dedup.IDFromSignedHeader,
		Tolerance:       DefaultTolerance,
	}
}

// Init implements Verifier: each secret is a whsec_ HMAC key or a whpk_
// Ed25519 public key.
func (s *StandardWebhooks) Init(c dedup.ProviderConfig) error {
	s.tolerance, s.now, s.signedContent = c.Tolerance, c.Now, c.SignedContent
	s.idHeaders, s.tsHeaders, s.sigHeaders = c.EventIDHeaders, []string{swTimestamp}, []string{c.SignatureHeader}
	// The Svix names stand in only for the spec's own, not for headers
	// the user named.
	if len(s.idHeaders) == 1 && s.idHeaders[0] == swID {
		s.idHeaders = []string{swID, "Svix-Id"}
	}
	s.tsHeaders = append(s.tsHeaders, "Svix-Timestamp")
	if c.SignatureHeader == swSignature {
		s.sigHeaders = append(s.sigHeaders, "Svix-Signature")
	}
	s.macs, s.publicKeys = nil, nil
	for i, secret := range c.Secrets {
		n := i + 1
		switch {
		case strings.HasPrefix(secret, "whpk_"):
			key, err := base64.StdEncoding.DecodeString(secret[len("whpk_"):])
			if err != nil || len(key) != ed25519.PublicKeySize {
				return fmt.Errorf("secret #%d: a whpk_ public key must be the base64 of %d bytes (an Ed25519 public key)", n, ed25519.PublicKeySize)
			}
			s.publicKeys = append(s.publicKeys, ed25519.PublicKey(key))
		case strings.HasPrefix(secret, "whsk_"):
			return fmt.Errorf("secret #%d is a whsk_ signing key, which only the sender may hold: give the receiver its whpk_ public key", n)
		default:
			key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
			if err != nil || len(key) == 0 {
				return fmt.Errorf("secret #%d: a standard_webhooks secret is whsec_ followed by base64 (the key), or a whpk_ public key", n)
			}
			s.macs = append(s.macs, &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }})
		}
	}
	return nil
}

// maxSWSignatures bounds the entries of a signature header that are
// looked at: a sender sends one per active secret; Ed25519 checks are
// not free.
const maxSWSignatures = 16

var ErrTooManySignatures = &reasonError{"signature header has more than 16 entries", dedup.ErrSignatureMalformed}

// Verify implements Verifier.
func (s *StandardWebhooks) Verify(r *http.Request, body []byte) (dedup.Verified, error) {
	id, err := firstHeader(r.Header, s.idHeaders)
	if err != nil {
		return dedup.Verified{}, err
	}
	ts, err := firstHeader(r.Header, s.tsHeaders)
	if err != nil {
		return dedup.Verified{}, err
	}
	sigs, err := firstHeader(r.Header, s.sigHeaders)
	if err != nil {
		return dedup.Verified{}, err
	}
	if err := checkUnixTime(ts, s.now(), s.tolerance); err != nil {
		return dedup.Verified{}, err
	}
	var v1 [][sha256.Size]byte
	var v1a [][ed25519.SignatureSize]byte
	entries := 0
	for entry := range strings.SplitSeq(sigs, " ") {
		if entry == "" {
			continue
		}
		if entries++; entries > maxSWSignatures {
			return dedup.Verified{}, ErrTooManySignatures
		}
		version, enc, _ := strings.Cut(entry, ",")
		switch version {
		case "v1":
			var sig [sha256.Size]byte
			if decodeB64(sig[:], enc) {
				v1 = append(v1, sig)
			}
		case "v1a":
			var sig [ed25519.SignatureSize]byte
			if decodeB64(sig[:], enc) {
				v1a = append(v1a, sig)
			}
		default:
			// Other versions are ignored, as the spec asks.
		}
	}
	if len(v1) == 0 && len(v1a) == 0 {
		return dedup.Verified{}, errSigMalformed
	}
	matched := 0
	if len(v1) > 0 {
		var sum [sha256.Size]byte
		for _, pool := range s.macs {
			mac := pool.Get().(hash.Hash)
			mac.Reset()
			mac.Write([]byte(id))
			mac.Write([]byte{'.'})
			mac.Write([]byte(ts))
			mac.Write([]byte{'.'})
			mac.Write(body)
			mac.Sum(sum[:0])
			pool.Put(mac)
			for i := range v1 {
				matched |= subtle.ConstantTimeCompare(sum[:], v1[i][:])
			}
		}
	}
	if matched == 0 && len(v1a) > 0 && len(s.publicKeys) > 0 {
		msg := make([]byte, 0, len(id)+len(ts)+2+len(body))
		msg = append(append(append(append(append(msg, id...), '.'), ts...), '.'), body...)
		for _, pk := range s.publicKeys {
			for i := range v1a {
				if ed25519.Verify(pk, msg, v1a[i][:]) {
					matched = 1
				}
			}
		}
	}
	if matched == 0 {
		return dedup.Verified{}, errSigMismatch
	}
	vd := dedup.Verified{ID: id}
	if s.signedContent {
		vd.Before = []byte(id + "." + ts + ".")
	}
	return vd, nil
}

// decodeB64 decodes standard, padded base64 of exactly len(dst) bytes.
func decodeB64(dst []byte, enc string) bool {
	if len(enc) != base64.StdEncoding.EncodedLen(len(dst)) {
		return false
	}
	var buf [ed25519.SignatureSize + 2]byte
	n, err := base64.StdEncoding.Strict().Decode(buf[:], []byte(enc))
	if err != nil || n != len(dst) {
		return false
	}
	copy(dst, buf[:n])
	return true
}

// UnmarshalCaddyfile accepts `provider standard_webhooks` with no
// arguments or block.
func (*StandardWebhooks) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return noOptions(d)
}

// Interface guards
var (
	_ dedup.Provider        = (*StandardWebhooks)(nil)
	_ caddyfile.Unmarshaler = (*StandardWebhooks)(nil)
)
