package sanghodedup

import (
	"crypto/hmac"
	"crypto/sha1" // #nosec G505 -- offered only for senders that still sign with HMAC-SHA1; see HMACScheme.Algorithm
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() {
	caddy.RegisterModule(HMACScheme{})
}

// HMACScheme is a generic scheme for senders that sign with an HMAC in
// one header, over the body and optionally a timestamp header and the
// event ID header:
//
//	"verifier": {"scheme": "hmac", "header": "X-Signature", "prefix": "sha256=",
//	             "timestamp_header": "X-Timestamp", "signed_content": "{timestamp}.{body}",
//	             "id_field": "id"}
//
// Secrets are used as bytes, whole. A delivery is accepted when its one
// signature matches the HMAC under any secret (several secrets: a
// rotation on this side). Where the event ID comes from: id_field (a
// top-level string field of the signed JSON body; id_header, if also
// given, must then agree with it), or id_header alone (a header: not
// signed, unless signed_content holds {id}).
type HMACScheme struct {
	// Header that carries the signature. Required, here or as the
	// handler's signature_header (which overrides it).
	Header string `json:"header,omitempty"`

	// Hash function of the HMAC: sha256, sha512 or sha1. Default: sha256.
	// sha1 is offered only because some senders still sign with
	// HMAC-SHA1 (which, unlike SHA-1 alone, is not broken); prefer
	// sha256 wherever the sender offers it.
	Algorithm string `json:"algorithm,omitempty"`

	// How the MAC is written in the header: hex (either case) or base64
	// (standard alphabet, padded). Default: hex.
	Encoding string `json:"encoding,omitempty"`

	// Text before the encoded MAC in the header, e.g. "sha256=" or "v0=";
	// a signature without it is refused. Default: none.
	Prefix string `json:"prefix,omitempty"`

	// Header that carries the signing time, in Unix seconds. With it the
	// handler's tolerance applies (default 5m) and signed_content must
	// hold {timestamp}. Default: none (no replay window).
	TimestampHeader string `json:"timestamp_header,omitempty"`

	// What the HMAC covers: a template in which {body} (exactly once) is
	// the raw body, {timestamp} the timestamp header's value and {id} the
	// event ID header's value; any other text is literal, e.g.
	// "v0:{timestamp}:{body}" (Slack, Zoom) or "{id}{timestamp}{body}".
	// With {id}, the event ID header is signed. Default: "{body}", or
	// "{timestamp}.{body}" with timestamp_header.
	SignedContent string `json:"signed_content,omitempty"`

	// Header that carries the event ID. The handler's event_id_header
	// overrides it.
	IDHeader string `json:"id_header,omitempty"`

	// Top-level field of the JSON body that holds the event ID (covered
	// by the signature, since the body is). Either id_field or an ID
	// header is required.
	IDField string `json:"id_field,omitempty"`

	mac macScheme
}

// CaddyModule returns the Caddy module information.
func (HMACScheme) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.verifiers.hmac",
		New: func() caddy.Module { return new(HMACScheme) },
	}
}

// Provision checks the options and prepares the template.
func (s *HMACScheme) Provision(caddy.Context) error {
	return s.setup()
}

func (s *HMACScheme) setup() error {
	if s.Algorithm == "" {
		s.Algorithm = "sha256"
	}
	if s.Encoding == "" {
		s.Encoding = "hex"
	}
	if s.SignedContent == "" {
		s.SignedContent = "{body}"
		if s.TimestampHeader != "" {
			s.SignedContent = "{timestamp}.{body}"
		}
	}
	for opt, v := range map[string]string{"header": s.Header, "timestamp_header": s.TimestampHeader, "id_header": s.IDHeader} {
		if v != "" && !validHeaderName(v) {
			return fmt.Errorf("provider hmac: %s %q is not a valid header name", opt, v)
		}
	}
	if s.IDField != "" && (s.IDField != strings.TrimSpace(s.IDField) || strings.ContainsAny(s.IDField, "\"\\")) {
		return fmt.Errorf("provider hmac: id_field %q: give the field's name as it is written in the JSON body, without quotes, escapes or spaces", s.IDField)
	}
	m := macScheme{prefix: s.Prefix, tsHeader: http.CanonicalHeaderKey(s.TimestampHeader)}
	if err := m.setAlgorithm(s.Algorithm, s.Encoding); err != nil {
		return err
	}
	if err := m.parseTemplate(s.SignedContent); err != nil {
		return err
	}
	switch {
	case m.hasTS && s.TimestampHeader == "":
		return errors.New("provider hmac: signed_content has {timestamp} but there is no timestamp_header")
	case !m.hasTS && s.TimestampHeader != "":
		return errors.New("provider hmac: timestamp_header is set but signed_content has no {timestamp}: the timestamp would not be signed")
	case m.hasID && s.IDField != "":
		return errors.New("provider hmac: signed_content has {id} (the event ID header) but the ID comes from id_field (the body)")
	}
	s.mac = m
	return nil
}

// Defaults implements Verifier.
func (s *HMACScheme) Defaults() SchemeDefaults {
	d := SchemeDefaults{SignatureHeader: s.Header, IDField: s.IDField}
	if s.IDHeader != "" {
		d.EventIDHeaders = []string{s.IDHeader}
	}
	switch {
	case s.IDField != "":
		d.IDSource = IDFromBody
	case s.mac.hasID:
		d.IDSource = IDFromSignedHeader
	default:
		d.IDSource = IDFromHeader
	}
	if s.TimestampHeader != "" {
		d.Tolerance = DefaultTolerance
	}
	return d
}

// Init implements Verifier.
func (s *HMACScheme) Init(c VerifierConfig) error {
	if s.mac.hasID && len(c.EventIDHeaders) == 0 {
		return errors.New("provider hmac: signed_content has {id} but there is no event ID header (id_header or event_id_header)")
	}
	return s.mac.init(c)
}

// Verify implements Verifier.
func (s *HMACScheme) Verify(r *http.Request, body []byte) (Verified, error) {
	return s.mac.verify(r, body)
}

// UnmarshalCaddyfile sets up the scheme from Caddyfile tokens:
//
//	provider hmac {
//		header <name>
//		algorithm sha256|sha512|sha1
//		encoding hex|base64
//		prefix <text>
//		timestamp_header <name>
//		signed_content <template>
//		id_header <name>
//		id_field <name>
//	}
func (s *HMACScheme) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // scheme name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := once(d, seen, "provider hmac", ""); err != nil {
			return err
		}
		var dst *string
		switch opt {
		case "header":
			dst = &s.Header
		case "algorithm":
			dst = &s.Algorithm
		case "encoding":
			dst = &s.Encoding
		case "prefix":
			dst = &s.Prefix
		case "timestamp_header":
			dst = &s.TimestampHeader
		case "signed_content":
			dst = &s.SignedContent
		case "id_header":
			dst = &s.IDHeader
		case "id_field":
			dst = &s.IDField
		default:
			return d.Errf("unrecognized provider hmac option %q", opt)
		}
		if err := oneArg(d, dst); err != nil {
			return err
		}
		if *dst == "" {
			return d.Errf("%s: needs a value that is not empty", opt)
		}
	}
	// Check now, so that the Caddyfile error points at the block.
	if err := (&HMACScheme{
		Header: s.Header, Algorithm: s.Algorithm, Encoding: s.Encoding, Prefix: s.Prefix,
		TimestampHeader: s.TimestampHeader, SignedContent: s.SignedContent, IDHeader: s.IDHeader, IDField: s.IDField,
	}).setup(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// macScheme is the engine of the body-signing HMAC schemes (github,
// shopify, hmac): one signature, in one header, over a template around
// the body.
type macScheme struct {
	// configuration
	newHash  func() hash.Hash
	size     int    // MAC length in bytes
	base64   bool   // else hex
	prefix   string // before the encoded MAC
	before   []part // the template before {body}
	after    []part // and after it
	hasTS    bool
	hasID    bool
	tsHeader string // canonical

	// from Init
	header        string
	idHeaders     []string
	tolerance     time.Duration
	now           func() time.Time
	macs          []*sync.Pool // one per secret, each yielding hash.Hash
	signedContent bool
}

// part is a piece of a signed_content template.
type part struct {
	kind byte // 'l' literal, 't' timestamp, 'i' event ID
	lit  string
}

func (m *macScheme) setAlgorithm(alg, enc string) error {
	switch alg {
	case "sha256":
		m.newHash, m.size = sha256.New, sha256.Size
	case "sha512":
		m.newHash, m.size = sha512.New, sha512.Size
	case "sha1":
		m.newHash, m.size = sha1.New, sha1.Size
	default:
		return fmt.Errorf("provider hmac: algorithm must be sha256, sha512 or sha1, not %q", alg)
	}
	switch enc {
	case "hex":
	case "base64":
		m.base64 = true
	default:
		return fmt.Errorf("provider hmac: encoding must be hex or base64, not %q", enc)
	}
	return nil
}

// parseTemplate reads a signed_content template.
func (m *macScheme) parseTemplate(t string) error {
	bodies := 0
	var parts []part
	lit := strings.Builder{}
	flush := func() {
		if lit.Len() > 0 {
			parts = append(parts, part{kind: 'l', lit: lit.String()})
			lit.Reset()
		}
	}
	for i := 0; i < len(t); {
		if t[i] != '{' && t[i] != '}' {
			lit.WriteByte(t[i])
			i++
			continue
		}
		var name string
		for _, n := range []string{"{body}", "{timestamp}", "{id}"} {
			if strings.HasPrefix(t[i:], n) {
				name = n
			}
		}
		flush()
		switch name {
		case "{body}":
			bodies++
			m.before, parts = parts, nil
		case "{timestamp}":
			m.hasTS = true
			parts = append(parts, part{kind: 't'})
		case "{id}":
			m.hasID = true
			parts = append(parts, part{kind: 'i'})
		default:
			return fmt.Errorf("provider hmac: signed_content %q: only {body}, {timestamp} and {id} may stand in braces", t)
		}
		i += len(name)
	}
	flush()
	if bodies != 1 {
		return fmt.Errorf("provider hmac: signed_content %q must hold {body} exactly once", t)
	}
	m.after = parts
	return nil
}

func (m *macScheme) init(c VerifierConfig) error {
	m.header = c.SignatureHeader
	m.idHeaders = c.EventIDHeaders
	m.tolerance = c.Tolerance
	m.now = c.Now
	m.signedContent = c.SignedContent
	m.macs = m.macs[:0]
	for _, s := range c.Secrets {
		key := []byte(s)
		newHash := m.newHash
		m.macs = append(m.macs, &sync.Pool{New: func() any { return hmac.New(newHash, key) }})
	}
	return nil
}

// maxMACSize is the largest MAC (SHA-512).
const maxMACSize = sha512.Size

// decodeMAC decodes an encoded MAC of m.size bytes into dst.
func (m *macScheme) decodeMAC(dst *[maxMACSize]byte, enc string) bool {
	if !m.base64 {
		return len(enc) == 2*m.size && decodeHex(dst[:m.size], enc)
	}
	if base64.StdEncoding.EncodedLen(m.size) != len(enc) {
		return false
	}
	var buf [base64MaxLen]byte
	n, err := base64.StdEncoding.Strict().Decode(buf[:], []byte(enc))
	if err != nil || n != m.size {
		return false
	}
	copy(dst[:], buf[:n])
	return true
}

// base64MaxLen is the decoded room needed for a base64 SHA-512 MAC.
const base64MaxLen = (maxMACSize + 2) / 3 * 3

func (m *macScheme) verify(r *http.Request, body []byte) (Verified, error) {
	sig, err := requireHeader(r.Header, m.header)
	if err != nil {
		return Verified{}, err
	}
	enc, ok := strings.CutPrefix(sig, m.prefix)
	if !ok {
		return Verified{}, errSigPrefix
	}
	var want [maxMACSize]byte
	if !m.decodeMAC(&want, enc) {
		return Verified{}, errSigEncoding
	}
	var ts, id string
	if m.hasTS {
		if ts, err = requireHeader(r.Header, m.tsHeader); err != nil {
			return Verified{}, err
		}
		if err := checkUnixTime(ts, m.now(), m.tolerance); err != nil {
			return Verified{}, err
		}
	}
	if m.hasID {
		if id, err = firstHeader(r.Header, m.idHeaders); err != nil {
			return Verified{}, err
		}
	}
	var bbuf, abuf [128]byte
	before := appendParts(bbuf[:0], m.before, ts, id)
	after := appendParts(abuf[:0], m.after, ts, id)
	var sum [maxMACSize]byte
	matched := 0
	for _, pool := range m.macs {
		mac := pool.Get().(hash.Hash)
		mac.Reset()
		mac.Write(before)
		mac.Write(body)
		mac.Write(after)
		mac.Sum(sum[:0])
		pool.Put(mac)
		matched |= subtle.ConstantTimeCompare(sum[:m.size], want[:m.size])
	}
	if matched == 0 {
		return Verified{}, errSigMismatch
	}
	vd := Verified{ID: id}
	if m.signedContent {
		vd.Before = cloneNonEmpty(before)
		vd.After = cloneNonEmpty(after)
	}
	return vd, nil
}

func appendParts(b []byte, parts []part, ts, id string) []byte {
	for _, p := range parts {
		switch p.kind {
		case 'l':
			b = append(b, p.lit...)
		case 't':
			b = append(b, ts...)
		case 'i':
			b = append(b, id...)
		}
	}
	return b
}

func cloneNonEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// firstHeader returns the value of the first of names that is present,
// which must be sent once and not be empty.
func firstHeader(h http.Header, names []string) (string, error) {
	for _, name := range names {
		if _, ok := h[name]; ok {
			return requireHeader(h, name)
		}
	}
	return "", fmt.Errorf("%w: %s", errSigMissing, strings.Join(names, ", "))
}

// checkUnixTime parses a signed timestamp in Unix seconds and checks it
// is within tolerance of now, in either direction, exactly.
func checkUnixTime(s string, now time.Time, tolerance time.Duration) error {
	if !isDigits(s) || len(s) > 18 {
		return errSigMalformed
	}
	t, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return errSigMalformed
	}
	if d := now.Sub(time.Unix(t, 0)); d > tolerance || d < -tolerance {
		return errSigTimestamp
	}
	return nil
}

// Interface guards
var (
	_ Verifier              = (*HMACScheme)(nil)
	_ caddy.Provisioner     = (*HMACScheme)(nil)
	_ caddyfile.Unmarshaler = (*HMACScheme)(nil)
)
