package sanghodedup

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Errors of event ID extraction; each is answered 400. Two event ID
// headers are errIDHeaders, with the other header errors below.
var (
	errIDMissing   = errors.New("no event ID: the body has no top-level \"id\" and the event ID header is absent")
	errIDNotInBody = errors.New("the body has no top-level \"id\" (require_body_id is on: the event ID header is not signed)")
	errIDInvalid   = errors.New("event ID must be 1-255 characters of [A-Za-z0-9_-]")
	errIDMismatch  = errors.New("the body's \"id\" and the event ID header differ")
	errIDDupKey    = errors.New("the body has more than one top-level \"id\"")
	errIDNotString = errors.New("the body's top-level \"id\" is not a string")
	errBodyJSON    = errors.New("the body starts as a JSON object but is malformed")
	errIDCaseKey   = errors.New("the body has a top-level key that is \"id\" in another case (e.g. \"ID\"), which Go's encoding/json would read as the ID")
	errBodyBOM     = errors.New("the body starts with a UTF-8 byte order mark, which JSON sent over a network must not have (RFC 8259)")
)

const maxIDLen = 255

// validID reports whether id is 1-255 characters of [A-Za-z0-9_-].
func validID(id string) bool {
	if len(id) == 0 || len(id) > maxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// event is what a delivery says about itself.
type event struct {
	id, typ    string
	fromHeader bool // the ID came from the (unsigned) header, not the body
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

// extractEvent returns the event ID and type of a delivery. The ID is
// the body's top-level "id" when the body is a JSON object that has one;
// when the header is present too they must be equal, since only the body
// is covered by the signature. Without an "id" in the body the ID is the
// header's, unless requireBodyID (then errIDNotInBody). The type is the
// body's top-level "type" when it is a string, else "".
func extractEvent(body []byte, headerIDs []string, requireBodyID bool) (event, error) {
	return extractEventField(body, headerIDs, requireBodyID, "id")
}

// extractEventField is extractEvent with the ID in the top-level field
// named field (e.g. the hmac provider's id_field). Errors about a field
// other than "id" name it.
func extractEventField(body []byte, headerIDs []string, requireBodyID bool, field string) (event, error) {
	ev, err := extractEventKey(body, headerIDs, requireBodyID, field)
	if err != nil && field != "id" {
		err = fmt.Errorf("id_field %q: %w", field, err)
	}
	return ev, err
}

func extractEventKey(body []byte, headerIDs []string, requireBodyID bool, field string) (event, error) {
	if len(headerIDs) > 1 {
		return event{}, errIDHeaders
	}
	headerID := ""
	if len(headerIDs) == 1 {
		headerID = headerIDs[0]
	}
	f, err := scanTopLevelKey(body, field)
	if err != nil {
		return event{}, err
	}
	ev := event{typ: f.typ}
	switch {
	case f.hasID:
		if !validID(f.id) {
			return ev, errIDInvalid
		}
		if headerID != "" && headerID != f.id {
			return ev, errIDMismatch
		}
		ev.id = f.id
		return ev, nil
	case requireBodyID:
		return ev, errIDNotInBody
	case headerID == "":
		return ev, errIDMissing
	case !validID(headerID):
		return ev, errIDInvalid
	}
	ev.id, ev.fromHeader = headerID, true
	return ev, nil
}

// topLevel holds the fields of a JSON object body that dedup needs.
type topLevel struct {
	id, typ string
	hasID   bool
}

// utf8BOM is the byte order mark that RFC 8259 forbids in networked JSON.
const utf8BOM = "\xef\xbb\xbf"

// maxNesting is encoding/json's limit on nested objects and arrays; a
// deeper body is malformed to a Go backend, so it is here too.
const maxNesting = 10000

// scanTopLevel reads the top-level "id" and "type" of a JSON object
// without unmarshaling the body, in one pass that validates the whole
// body as encoding/json.Valid does (strings, escapes, numbers, literals,
// nesting up to 10000; invalid UTF-8 inside strings is allowed, as
// there), and allocates nothing but the two strings it returns. A body
// that is not a JSON object (empty, an array, not JSON at all) yields no
// fields and no error: the event ID then comes from the header, if
// require_body_id allows it. A body that starts with '{' must be a
// well-formed object, else errBodyJSON. Refused with their own errors:
// a second top-level "id" (errIDDupKey: JSON parsers disagree on which
// one wins, so the backend might process another ID than the one
// deduplicated); a top-level key that is "id" in another case, such as
// "ID" (errIDCaseKey: Go's encoding/json matches field names without
// regard to case); a body that starts with a UTF-8 byte order mark
// (errBodyBOM: Sangho never sends one, RFC 8259 forbids it, and parsers
// disagree, so the backend might read an ID the scan did not).
func scanTopLevel(b []byte) (topLevel, error) { return scanTopLevelKey(b, "id") }

// scanTopLevelKey is scanTopLevel with the ID in the top-level field
// named idKey instead of "id" (the same checks apply to it: given twice,
// not a string, present in another case).
func scanTopLevelKey(b []byte, idKey string) (topLevel, error) {
	var f topLevel
	if bytes.HasPrefix(b, []byte(utf8BOM)) {
		return f, errBodyBOM
	}
	s := jsonScanner{b: b}
	s.ws()
	if s.i >= len(b) || b[s.i] != '{' {
		return f, nil
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
		return f, s.end()
	}
	typSeen := false
	for {
		s.ws()
		key, keyEsc, ok := s.str()
		if !ok {
			return f, errBodyJSON
		}
		s.ws()
		if s.peek() != ':' {
			return f, errBodyJSON
		}
		s.i++
		s.ws()
		isID, isIDCase, isType := classifyKey(key, keyEsc, idKey)
		switch {
		case isID:
			if f.hasID {
				return f, errIDDupKey
			}
			if s.peek() != '"' {
				if !s.skipValue() {
					return f, errBodyJSON
				}
				return f, errIDNotString
			}
			raw, esc, ok := s.str()
			if !ok {
				return f, errBodyJSON
			}
			f.id, f.hasID = decodeStr(raw, esc), true
		case isIDCase:
			return f, errIDCaseKey
		case isType && !typSeen && s.peek() == '"':
			raw, esc, ok := s.str()
			if !ok {
				return f, errBodyJSON
			}
			f.typ, typSeen = decodeStr(raw, esc), true
		default:
			if !s.skipValue() {
				return f, errBodyJSON
			}
		}
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return f, s.end()
		default:
			return f, errBodyJSON
		}
	}
}

// classifyKey tells whether a raw top-level key is idKey ("id"), idKey
// in another case (as Go's encoding/json would match it:
// bytes.EqualFold), or "type", decoding escapes only when the key has
// some and is short enough to be one of them (e.g. "\u0069d" is "id").
func classifyKey(raw []byte, escaped bool, idKey string) (isID, isIDCase, isType bool) {
	// A character of a matching key is at most one \uXXXX escape, or 3
	// bytes of UTF-8 (e.g. the Kelvin sign, which folds to "k").
	runes := max(len(idKey), len("type"))
	if escaped {
		if len(raw) > 6*runes {
			return false, false, false
		}
		raw = []byte(decodeStr(raw, true))
	}
	if len(raw) > 3*runes { // no spelling of idKey or "type" is longer
		return false, false, false
	}
	isID = string(raw) == idKey
	return isID, !isID && bytes.EqualFold(raw, []byte(idKey)), string(raw) == "type"
}

// decodeStr turns the raw content of a JSON string, already validated,
// into a Go string.
func decodeStr(raw []byte, escaped bool) string {
	if !escaped {
		return string(raw)
	}
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var out string
	if json.Unmarshal(quoted, &out) != nil {
		return "\x00invalid" // never a valid ID or key
	}
	return out
}

type jsonScanner struct {
	b []byte
	i int
}

func (s *jsonScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *jsonScanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// end accepts only trailing whitespace after the object.
func (s *jsonScanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return errBodyJSON
	}
	return nil
}

// strStop marks the bytes that end the fast run through a string: the
// closing quote, an escape, and the control characters JSON forbids.
var strStop = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// str reads a string at s.i, validating it (no control characters,
// only JSON's escapes), and returns its raw content (between the quotes)
// and whether it holds escapes.
func (s *jsonScanner) str() (raw []byte, escaped, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	start := s.i + 1
	b := s.b
	i := start
	for {
		// 8 bytes at a time while none of them can end the run, and 32
		// at a time once the string proves long. Kept by measurement:
		// BenchmarkServeHTTP/memory/new-64KiB takes 107-110 us with it,
		// 117-124 us byte by byte (1 KiB bodies: no difference).
		for n := 0; i+8 <= len(b) && stops(binary.LittleEndian.Uint64(b[i:])) == 0; n++ {
			i += 8
			if n == 3 {
				for i+32 <= len(b) && stops(binary.LittleEndian.Uint64(b[i:]))|
					stops(binary.LittleEndian.Uint64(b[i+8:]))|
					stops(binary.LittleEndian.Uint64(b[i+16:]))|
					stops(binary.LittleEndian.Uint64(b[i+24:])) == 0 {
					i += 32
				}
			}
		}
		for i < len(b) && !strStop[b[i]] {
			i++
		}
		if i >= len(b) {
			return nil, false, false
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return b[start:i], escaped, true
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return nil, false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return nil, false, false
				}
				i += 6
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		default:
			i++ // a byte the word test flagged but that does not stop the run
		}
	}
}

// stops reports (non-zero) whether one of the 8 bytes in w ends a run
// through a string (see strStop).
func stops(w uint64) uint64 { return hasLess(w, 0x20) | hasByte(w, '"') | hasByte(w, '\\') }

// hasLess reports (non-zero) whether a byte of w is below n (n <= 128);
// hasByte whether one equals c. Classic SWAR bit tricks.
func hasLess(w uint64, n byte) uint64 {
	return (w - 0x0101010101010101*uint64(n)) & ^w & 0x8080808080808080
}

func hasByte(w uint64, c byte) uint64 {
	x := w ^ (0x0101010101010101 * uint64(c))
	return (x - 0x0101010101010101) & ^x & 0x8080808080808080
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// skipValue skips and validates one value of any kind at s.i. Nested
// objects and arrays are walked with an explicit stack, so a deep body
// costs no recursion; with the top-level object, nesting may not exceed
// maxNesting.
func (s *jsonScanner) skipValue() bool {
	var stackBuf [64]byte
	stack := stackBuf[:0]
	for {
		// A value is expected at s.i.
		s.ws()
		switch c := s.peek(); c {
		case '{', '[':
			if len(stack)+1 >= maxNesting { // +1: the top-level object
				return false
			}
			s.i++
			s.ws()
			if end := c + 2; s.peek() == end { // '{'+2 is '}', '['+2 is ']'
				s.i++
				break
			}
			stack = append(stack, c)
			if c == '{' && !s.member() {
				return false
			}
			continue
		case '"':
			if _, _, ok := s.str(); !ok {
				return false
			}
		case 't':
			if !s.literal("true") {
				return false
			}
		case 'f':
			if !s.literal("false") {
				return false
			}
		case 'n':
			if !s.literal("null") {
				return false
			}
		default:
			if !s.number() {
				return false
			}
		}
		// A value ended: close what it ends, or go on to the next one.
		for {
			if len(stack) == 0 {
				return true
			}
			s.ws()
			open := stack[len(stack)-1]
			c := s.peek()
			if c == ',' {
				s.i++
				if open == '{' && !s.member() {
					return false
				}
				break
			}
			if c != open+2 {
				return false
			}
			s.i++
			stack = stack[:len(stack)-1]
		}
	}
}

// member reads the key and colon of an object member, up to its value.
func (s *jsonScanner) member() bool {
	s.ws()
	if _, _, ok := s.str(); !ok {
		return false
	}
	s.ws()
	if s.peek() != ':' {
		return false
	}
	s.i++
	return true
}

func (s *jsonScanner) literal(lit string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return false
	}
	s.i += len(lit)
	return true
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScanner) number() bool {
	b, i := s.b, s.i
	digits := func() bool {
		start := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i > start
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	s.i = i
	return true
}
