package providers

import (
	"crypto/hmac"
	"crypto/sha1" // #nosec G505 -- offered only for senders that still sign with HMAC-SHA1; see HMAC.Algorithm
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
	"golang.org/x/net/http/httpguts"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
)

func init() {
	caddy.RegisterModule(HMAC{})
	cfargs.Options(HMAC{})
}

// HMAC is a generic provider for senders that sign with an HMAC in
// one header, over the body and optionally a timestamp header and the
// event ID header:
//
//	"provider": {"name": "hmac", "header": "X-Signature", "prefix": "sha256=",
//	             "timestamp_header": "X-Timestamp", "signed_content": "{timestamp}.{body}",
//	             "id_field": "id"}
//
// Secrets are used as bytes, whole. A delivery is accepted when its one
// signature matches the HMAC under any secret (several secrets: a
// rotation on this side). Where the event ID comes from: id_field (a
// top-level string field of the signed JSON body; id_header, if also
// given, must then agree with it), or id_header alone (a header: not
// signed, unless signed_content holds {id}).
type HMAC struct {
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

	// Header that carries the signing time, written as timestamp_format
	// says. With it the handler's tolerance applies (default 5m) and
	// signed_content must hold {timestamp}. Default: none (no replay
	// window).
	TimestampHeader string `json:"timestamp_header,omitempty"`

	// How the timestamp header writes the time: "unix" (seconds, digits
	// with no leading zero: 1733140800) or "rfc3339" (Twitch's
	// 2019-11-16T10:11:12.634234626Z: upper-case T and Z or a ±hh:mm
	// offset, at most 9 fraction digits). Only those exact forms are
	// accepted, and the HMAC covers the header's bytes as sent. Default:
	// unix.
	TimestampFormat string `json:"timestamp_format,omitempty"`

	// What the HMAC covers: a template in which {body} (exactly once) is
	// the raw body, {timestamp} the timestamp header's value and {id} the
	// event ID header's value; any other text is literal, e.g.
	// "v0:{timestamp}:{body}" (Slack) or "{id}{timestamp}{body}" (Twitch,
	// with timestamp_format rfc3339). With {id}, the event ID header is
	// signed. Two of {id}, {timestamp} and {body} must be kept apart by
	// literal text holding a character that cannot occur in one of them
	// (an ID is letters, digits, _ and -; a Unix timestamp digits), else
	// the same signed bytes would read as another ID or timestamp and a
	// captured delivery could be replayed as a new event: "{id}{timestamp}"
	// with Unix timestamps is refused, "{id}.{timestamp}" is not. An RFC
	// 3339 timestamp needs no separator: its form shows where it starts
	// and ends. Default: "{body}", or "{timestamp}.{body}" with
	// timestamp_header.
	SignedContent string `json:"signed_content,omitempty"`

	// Header that carries the event ID. The handler's event_id_header
	// overrides it.
	IDHeader string `json:"id_header,omitempty"`

	// Top-level field of the JSON body that holds the event ID (covered
	// by the signature, since the body is). Either id_field or an ID
	// header is required.
	IDField string `json:"id_field,omitempty"`

	mac macEngine
}

// CaddyModule returns the Caddy module information.
func (HMAC) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.providers.hmac",
		New: func() caddy.Module { return new(HMAC) },
	}
}

// Provision checks the options and prepares the template.
func (s *HMAC) Provision(caddy.Context) error {
	if err := s.setup(); err != nil {
		return fmt.Errorf("provider hmac: %w", err)
	}
	return nil
}

// Timestamp formats of the hmac provider.
const (
	tsUnix    = "unix"
	tsRFC3339 = "rfc3339"
)

// setup checks the options and prepares the template. Its errors name
// the option; the caller says which provider.
func (s *HMAC) setup() error {
	if s.Algorithm == "" {
		s.Algorithm = "sha256"
	}
	if s.Encoding == "" {
		s.Encoding = "hex"
	}
	if s.TimestampFormat == "" && s.TimestampHeader != "" {
		s.TimestampFormat = tsUnix
	}
	if s.SignedContent == "" {
		s.SignedContent = "{body}"
		if s.TimestampHeader != "" {
			s.SignedContent = "{timestamp}.{body}"
		}
	}
	for opt, v := range map[string]string{"header": s.Header, "timestamp_header": s.TimestampHeader, "id_header": s.IDHeader} {
		if v != "" && !httpguts.ValidHeaderFieldName(v) {
			return fmt.Errorf("%s %q is not a valid header name", opt, v)
		}
	}
	if s.IDField != "" && (s.IDField != strings.TrimSpace(s.IDField) || strings.ContainsAny(s.IDField, "\"\\")) {
		return fmt.Errorf("id_field %q: give the field's name as it is written in the JSON body, without quotes, escapes or spaces", s.IDField)
	}
	m := macEngine{prefix: s.Prefix, tsHeader: http.CanonicalHeaderKey(s.TimestampHeader), tsRFC3339: s.TimestampFormat == tsRFC3339}
	if err := m.setAlgorithm(s.Algorithm, s.Encoding); err != nil {
		return err
	}
	if err := m.parseTemplate(s.SignedContent); err != nil {
		return err
	}
	switch {
	case s.TimestampFormat != "" && s.TimestampFormat != tsUnix && s.TimestampFormat != tsRFC3339:
		return fmt.Errorf("timestamp_format must be %s or %s, not %q", tsUnix, tsRFC3339, s.TimestampFormat)
	case s.TimestampFormat != "" && s.TimestampHeader == "":
		return errors.New("timestamp_format is set but there is no timestamp_header")
	case m.hasTS && s.TimestampHeader == "":
		return errors.New("signed_content has {timestamp} but there is no timestamp_header")
	case !m.hasTS && s.TimestampHeader != "":
		return errors.New("timestamp_header is set but signed_content has no {timestamp}: the timestamp would not be signed")
	case m.hasID && s.IDField != "":
		return errors.New("signed_content has {id} (the event ID header) but the ID comes from id_field (the body)")
	}
	if err := m.checkSeparated(s.SignedContent); err != nil {
		return err
	}
	s.mac = m
	return nil
}

// Defaults implements Verifier.
func (s *HMAC) Defaults() dedup.ProviderDefaults {
	d := dedup.ProviderDefaults{SignatureHeader: s.Header, IDField: s.IDField}
	if s.IDHeader != "" {
		d.EventIDHeaders = []string{s.IDHeader}
	}
	switch {
	case s.IDField != "":
		d.IDSource = dedup.IDFromBody
	case s.mac.hasID:
		d.IDSource = dedup.IDFromSignedHeader
	default:
		d.IDSource = dedup.IDFromHeader
	}
	if s.TimestampHeader != "" {
		d.Tolerance = DefaultTolerance
	}
	return d
}

// Init implements Verifier.
func (s *HMAC) Init(c dedup.ProviderConfig) error {
	if s.mac.hasID && len(c.EventIDHeaders) == 0 {
		return errors.New("signed_content has {id} but there is no event ID header (id_header or event_id_header)")
	}
	return s.mac.init(c)
}

// Verify implements Verifier.
func (s *HMAC) Verify(r *http.Request, body []byte) (dedup.Verified, error) {
	return s.mac.verify(r, body)
}

// UnmarshalCaddyfile sets up the provider from Caddyfile tokens:
//
//	provider hmac {
//		header <name>
//		algorithm sha256|sha512|sha1
//		encoding hex|base64
//		prefix <text>
//		timestamp_header <name>
//		timestamp_format unix|rfc3339
//		signed_content <template>
//		id_header <name>
//		id_field <name>
//	}
func (s *HMAC) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // provider name
	if err := cfargs.NoValue(d, "", "its options go in its block, the secret in the directive's secret"); err != nil {
		return err
	}
	// The handler's parser prefixes each error with "provider hmac: ".
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("%s given more than once", opt)
		}
		seen[opt] = true
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
		case "timestamp_format":
			dst = &s.TimestampFormat
		case "signed_content":
			dst = &s.SignedContent
		case "id_header":
			dst = &s.IDHeader
		case "id_field":
			dst = &s.IDField
		default:
			return cfargs.Unknown(d, "option", s)
		}
		if err := cfargs.One(d, dst); err != nil { // never ""
			return err
		}
	}
	// Check now, so that the Caddyfile error points at the block.
	if err := (&HMAC{
		Header: s.Header, Algorithm: s.Algorithm, Encoding: s.Encoding, Prefix: s.Prefix,
		TimestampHeader: s.TimestampHeader, TimestampFormat: s.TimestampFormat, SignedContent: s.SignedContent, IDHeader: s.IDHeader, IDField: s.IDField,
	}).setup(); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// macEngine is the engine of the body-signing HMAC providers (github,
// shopify, hmac): one signature, in one header, over a template around
// the body.
type macEngine struct {
	// configuration
	newHash   func() hash.Hash
	size      int    // MAC length in bytes
	base64    bool   // else hex
	prefix    string // before the encoded MAC
	before    []part // the template before {body}
	after     []part // and after it
	hasTS     bool
	hasID     bool
	tsHeader  string // canonical
	tsRFC3339 bool   // the timestamp is RFC 3339, else Unix seconds

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

func (m *macEngine) setAlgorithm(alg, enc string) error {
	switch alg {
	case "sha256":
		m.newHash, m.size = sha256.New, sha256.Size
	case "sha512":
		m.newHash, m.size = sha512.New, sha512.Size
	case "sha1":
		m.newHash, m.size = sha1.New, sha1.Size
	default:
		return fmt.Errorf("algorithm must be sha256, sha512 or sha1, not %q", alg)
	}
	switch enc {
	case "hex":
	case "base64":
		m.base64 = true
	default:
		return fmt.Errorf("encoding must be hex or base64, not %q", enc)
	}
	return nil
}

// parseTemplate reads a signed_content template.
func (m *macEngine) parseTemplate(t string) error {
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
			return fmt.Errorf("signed_content %q: only {body}, {timestamp} and {id} may stand in braces", t)
		}
		i += len(name)
	}
	flush()
	if bodies != 1 {
		return fmt.Errorf("signed_content %q must hold {body} exactly once", t)
	}
	m.after = parts
	return nil
}

// placeholderNames name the variable parts in errors.
var placeholderNames = map[byte]string{'b': "{body}", 't': "{timestamp}", 'i': "{id}"}

// checkSeparated refuses a template whose signed bytes do not say where
// each variable part ends, else a captured delivery could be sent again
// with bytes moved from one part to another (the ID msg_100 at 1733140800
// signs the same bytes as msg_10 at 01733140800) and be taken for a new
// event. The body holds anything, so the parts before it are read from
// the start and the parts after it from the end, one at a time: a part's
// far end (from the body) is known where the text between it and the
// next part towards the body holds a byte the part cannot hold (ends).
// Where it does not, two neighbours are read together: the text after
// the pair (towards the body) must hold a byte that neither part, nor
// the text between them, holds, and that text must keep the two apart
// (apart). Pairwise checks alone let "{body}-{timestamp}-{id}" pass:
// body 1, time 2 and ID 3-x sign the same bytes as body 1-2, time 3
// and ID x. An RFC 3339 timestamp keeps itself apart: it starts with
// four digits and a '-' and ends with Z or ±hh:mm, and holds a ':', which
// an event ID cannot.
func (m *macEngine) checkSeparated(t string) error {
	// vars[k] are the variable parts in order; lits[k] the literal text
	// before vars[k], lits[len(vars)] the text after the last.
	var vars []byte
	lits := []string{""}
	body := -1
	for _, p := range append(append(append([]part(nil), m.before...), part{kind: 'b'}), m.after...) {
		if p.kind == 'l' {
			lits[len(lits)-1] += p.lit
			continue
		}
		if p.kind == 'b' {
			body = len(vars)
		}
		vars = append(vars, p.kind)
		lits = append(lits, "")
	}
	refuse := func(a, b, far byte) error {
		hint := fmt.Sprintf(`: put between them a character that %s cannot hold, e.g. "."`, placeholderNames[far])
		if !m.tsRFC3339 && (a == 't' || b == 't') {
			hint += ", or, for an RFC 3339 timestamp, set timestamp_format rfc3339"
		}
		return fmt.Errorf("signed_content %q: %s and %s are not kept apart, so the same signed bytes could be read with a character moved from one to the other (a replay under another ID)%s",
			t, placeholderNames[a], placeholderNames[b], hint)
	}
	for i := 0; i < body; { // from the start: lits[i+1] follows vars[i]
		switch {
		case m.ends(vars[i], lits[i+1], vars[i+1]):
			i++
		case i+1 < body && m.apart(vars[i], lits[i+1], vars[i+1]) && m.bounds(lits[i+2], lits[i+1], vars[i], vars[i+1]):
			i += 2
		default:
			return refuse(vars[i], vars[i+1], vars[i])
		}
	}
	for j := len(vars) - 1; j > body; { // from the end: lits[j] precedes vars[j]
		switch {
		case m.ends(vars[j], lits[j], vars[j-1]):
			j--
		case j-1 > body && m.apart(vars[j-1], lits[j], vars[j]) && m.bounds(lits[j-1], lits[j], vars[j-1], vars[j]):
			j -= 2
		default:
			return refuse(vars[j-1], vars[j], vars[j])
		}
	}
	return nil
}

// ends reports whether the end of the variable part kind away from the
// body is known from the literal text lit between it and next, its
// neighbour towards the body: lit holds a byte that kind cannot hold, or
// kind or next (not the body) is an RFC 3339 timestamp.
func (m *macEngine) ends(kind byte, lit string, next byte) bool {
	return m.tsRFC3339 && (kind == 't' || next == 't') ||
		anyByte(lit, func(c byte) bool { return !m.mayHold(kind, c) })
}

// bounds reports whether lit, the text beyond the pair a, b (towards the
// body), holds a byte that neither a nor b, nor the text between them,
// holds: its first (or last) occurrence then marks where the pair ends.
func (m *macEngine) bounds(lit, between string, a, b byte) bool {
	return anyByte(lit, func(c byte) bool {
		return !m.mayHold(a, c) && !m.mayHold(b, c) && strings.IndexByte(between, c) < 0
	})
}

// apart reports whether the variable parts a and b, with the literal lit
// between them, cannot trade bytes.
func (m *macEngine) apart(a byte, lit string, b byte) bool {
	return m.tsRFC3339 && (a == 't' || b == 't') ||
		anyByte(lit, func(c byte) bool { return !m.mayHold(a, c) || !m.mayHold(b, c) })
}

// anyByte reports whether some byte of lit satisfies f.
func anyByte(lit string, f func(byte) bool) bool {
	for i := 0; i < len(lit); i++ {
		if f(lit[i]) {
			return true
		}
	}
	return false
}

// mayHold reports whether the variable part kind may hold the byte c:
// an event ID only what validID accepts, a Unix timestamp only digits,
// the body anything.
func (m *macEngine) mayHold(kind, c byte) bool {
	switch kind {
	case 'i':
		return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
	case 't':
		return '0' <= c && c <= '9'
	}
	return true
}

func (m *macEngine) init(c dedup.ProviderConfig) error {
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
func (m *macEngine) decodeMAC(dst *[maxMACSize]byte, enc string) bool {
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

func (m *macEngine) verify(r *http.Request, body []byte) (dedup.Verified, error) {
	sig, err := requireHeader(r.Header, m.header)
	if err != nil {
		return dedup.Verified{}, err
	}
	enc, ok := strings.CutPrefix(sig, m.prefix)
	if !ok {
		return dedup.Verified{}, ErrSignaturePrefix
	}
	var want [maxMACSize]byte
	if !m.decodeMAC(&want, enc) {
		return dedup.Verified{}, ErrSignatureEncoding
	}
	var ts, id string
	if m.hasTS {
		if ts, err = requireHeader(r.Header, m.tsHeader); err != nil {
			return dedup.Verified{}, err
		}
		check := checkUnixTime
		if m.tsRFC3339 {
			check = checkRFC3339Time
		}
		if err := check(ts, m.now(), m.tolerance); err != nil {
			return dedup.Verified{}, err
		}
	}
	if m.hasID {
		if id, err = firstHeader(r.Header, m.idHeaders); err != nil {
			return dedup.Verified{}, err
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
		return dedup.Verified{}, errSigMismatch
	}
	vd := dedup.Verified{ID: id}
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
// is within tolerance of now, in either direction, exactly. Only the
// canonical form is accepted (digits, no leading zero): the signature
// covers the header's bytes, and a zero that adds nothing to the time
// could be a character moved from the part signed before it.
func checkUnixTime(s string, now time.Time, tolerance time.Duration) error {
	if !isDigits(s) || len(s) > 18 || len(s) > 1 && s[0] == '0' {
		return errSigMalformed
	}
	t, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return errSigMalformed
	}
	return checkTime(time.Unix(t, 0), now, tolerance)
}

// checkRFC3339Time parses a signed timestamp in RFC 3339 and checks it
// is within tolerance of now, in either direction, exactly. Only the
// strict form is accepted: YYYY-MM-DDThh:mm:ss, an optional fraction of
// 1 to 9 digits, then Z or ±hh:mm (upper-case T and Z). That form is
// what keeps it apart from the parts signed next to it (see
// checkSeparated); the signature covers the header's bytes as sent, so
// the same instant written another way does not match.
func checkRFC3339Time(s string, now time.Time, tolerance time.Duration) error {
	if !strictRFC3339(s) {
		return errSigMalformed
	}
	t, err := time.Parse(time.RFC3339, s) // checks the ranges: month 13, 24:00, ...
	if err != nil {
		return errSigMalformed
	}
	return checkTime(t, now, tolerance)
}

// strictRFC3339 reports whether s has the form
// YYYY-MM-DDThh:mm:ss[.f{1,9}](Z|±hh:mm).
func strictRFC3339(s string) bool {
	const shape = "dddd-dd-ddTdd:dd:dd"
	if len(s) <= len(shape) {
		return false
	}
	for i := 0; i < len(shape); i++ {
		if shape[i] == 'd' && !isDigits(s[i:i+1]) || shape[i] != 'd' && s[i] != shape[i] {
			return false
		}
	}
	rest := s[len(shape):]
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && isDigits(rest[n:n+1]) {
			n++
		}
		if n == 1 || n > 10 {
			return false
		}
		rest = rest[n:]
	}
	if rest == "Z" {
		return true
	}
	return len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && isDigits(rest[1:3]) && rest[3] == ':' && isDigits(rest[4:6])
}

// checkTime checks that t is within tolerance of now, in either
// direction, exactly. time.Time.Sub saturates, so no t can overflow.
func checkTime(t, now time.Time, tolerance time.Duration) error {
	if d := now.Sub(t); d > tolerance || d < -tolerance {
		return errSigTimestamp
	}
	return nil
}

// Interface guards
var (
	_ dedup.Provider        = (*HMAC)(nil)
	_ caddy.Provisioner     = (*HMAC)(nil)
	_ caddyfile.Unmarshaler = (*HMAC)(nil)
)
