package sanghodedup

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"

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
	// partial: the body was read up to its ID only (eventOf with toID):
	// the rest is unchecked (readRest), and typ is "" unless "type" came
	// first.
	partial bool
	scan    topLevel // the body's scan so far, when partial...
	pos     scanPos  // ... and where it stopped
}

// Errors of the headers a delivery is read from. A header sent more
// than once is refused (which value would a backend read?): the
// signature's is answered 401, the event ID's 400.
var (
	errIDHeaders       = errors.New("more than one event ID header")
	errIDHeaderMissing = errors.New("no event ID: the event ID header is absent")
)

// eventOf returns the event ID and type of a verified delivery, from
// where the provider says. With toID, a body that holds the ID is read
// only up to it (event.partial when something is left unread): what it
// read is checked as in a whole read, and an error found there is the
// same, but what follows the ID is not read at all.
func (h *Handler) eventOf(r *http.Request, body []byte, vd *dedup.Verified, toID bool) (event, error) {
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
	ev, err := extractEventField(body, headerIDs, h.requireBodyID, s.idField, toID)
	if s.typeHeader != "" {
		ev.typ = r.Header.Get(s.typeHeader)
	}
	return ev, err
}

// readRest reads the rest of a body that eventOf read up to its ID
// (ev.partial), from where it stopped: the same checks, with the same
// errors, as a whole read. The type is the body's if it came after the
// ID (unless the provider's type header gives it).
func (h *Handler) readRest(body []byte, ev event) (event, error) {
	s := &h.provider
	f, err := scanRest(body, s.idField, ev.scan, ev.pos)
	if err != nil {
		if s.idField != "id" {
			err = fmt.Errorf("id_field %q: %w", s.idField, err)
		}
		return ev, err
	}
	if s.typeHeader == "" {
		ev.typ = f.typ
	}
	ev.partial, ev.scan, ev.pos = false, topLevel{}, scanPos{}
	return ev, nil
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

// extractEventField returns the event ID and type of a delivery. The ID
// is the body's top-level field ("id", or the hmac provider's id_field)
// when the body is a JSON object that has one; when the header is
// present too they must be equal, since only the body is covered by the
// signature. Without the field in the body the ID is the header's,
// unless requireBodyID (then errIDNotInBody). The type is the body's
// top-level "type" when it is a string, else "". Errors about a field
// other than "id" name it.
func extractEventField(body []byte, headerIDs []string, requireBodyID bool, field string, toID bool) (event, error) {
	ev, err := extractEventKey(body, headerIDs, requireBodyID, field, toID)
	if err != nil && field != "id" {
		err = fmt.Errorf("id_field %q: %w", field, err)
	}
	return ev, err
}

func extractEventKey(body []byte, headerIDs []string, requireBodyID bool, field string, toID bool) (event, error) {
	if len(headerIDs) > 1 {
		return event{}, errIDHeaders
	}
	headerID := ""
	if len(headerIDs) == 1 {
		headerID = headerIDs[0]
	}
	f, pos, err := scanTop(body, field, toID)
	if err != nil {
		return event{}, err
	}
	ev := event{typ: f.typ, partial: f.partial, scan: f, pos: pos}
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
	partial bool // the scan stopped after the ID (scanTop's toID)
}

// scanPos is where a partial scan stopped, for scanRest to go on.
type scanPos struct {
	next    int  // the index after the ID's value
	typSeen bool // a top-level "type" string was read (the first counts)
}

// utf8BOM is the byte order mark that RFC 8259 forbids in networked JSON.
const utf8BOM = "\xef\xbb\xbf"

// maxNesting is encoding/json's limit on nested objects and arrays; a
// deeper body is malformed to a Go backend, so it is here too.
const maxNesting = 10000

// scanTopLevelKey reads the top-level idKey (the provider's ID field,
// usually "id") and "type" of a JSON object
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
// The same checks apply to idKey when it is not "id": given twice, not
// a string, present in another case.
func scanTopLevelKey(b []byte, idKey string) (topLevel, error) {
	f, _, err := scanTop(b, idKey, false)
	return f, err
}

// scanTop is scanTopLevelKey, or with toID the same up to the ID's
// value: once it is read (a valid string, the first idKey, no key before
// it in another case) the scan stops there, partial, the rest unread.
func scanTop(b []byte, idKey string, toID bool) (topLevel, scanPos, error) {
	var f topLevel
	var pos scanPos
	if bytes.HasPrefix(b, []byte(utf8BOM)) {
		return f, pos, errBodyBOM
	}
	s := jsonScanner{b: b}
	s.ws()
	if s.i >= len(b) || b[s.i] != '{' {
		return f, pos, nil
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
		return f, pos, s.end()
	}
	err := scanMembers(&s, &f, &pos, idKey, toID, false)
	return f, pos, err
}

// scanRest reads the rest of a body whose scan stopped after its ID
// (f.partial), from there, as if the scan had gone on.
func scanRest(b []byte, idKey string, f topLevel, pos scanPos) (topLevel, error) {
	f.partial = false
	err := scanMembers(&jsonScanner{b: b, i: pos.next}, &f, &pos, idKey, false, true)
	return f, err
}

// scanMembers reads the members of the top-level object at s.i: a
// member, or with afterValue first the comma or brace after one.
func scanMembers(s *jsonScanner, f *topLevel, pos *scanPos, idKey string, toID, afterValue bool) error {
	for {
		if afterValue {
			s.ws()
			switch s.peek() {
			case ',':
				s.i++
			case '}':
				s.i++
				return s.end()
			default:
				return errBodyJSON
			}
		}
		afterValue = true
		s.ws()
		key, keyEsc, ok := s.str()
		if !ok {
			return errBodyJSON
		}
		s.ws()
		if s.peek() != ':' {
			return errBodyJSON
		}
		s.i++
		s.ws()
		isID, isIDCase, isType := classifyKey(key, keyEsc, idKey)
		switch {
		case isID:
			if f.hasID {
				return errIDDupKey
			}
			if s.peek() != '"' {
				if !s.skipValue() {
					return errBodyJSON
				}
				return errIDNotString
			}
			raw, esc, ok := s.str()
			if !ok {
				return errBodyJSON
			}
			f.id, f.hasID = decodeStr(raw, esc), true
			if toID {
				f.partial, pos.next = true, s.i
				return nil
			}
		case isIDCase:
			return errIDCaseKey
		case isType && !pos.typSeen && s.peek() == '"':
			raw, esc, ok := s.str()
			if !ok {
				return errBodyJSON
			}
			f.typ, pos.typSeen = decodeStr(raw, esc), true
		default:
			if !s.skipValue() {
				return errBodyJSON
			}
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

// The zero-width non-joiner and joiner are format characters that words
// (Persian, Indic scripts) and emoji sequences are written with: kept.
const zwnj, zwj = '\u200c', '\u200d'

// printableASCII is whether s is only printable ASCII (space to '~'),
// none of which cleanEventType replaces: most types, checked without
// decoding a rune or looking up a Unicode table.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' {
			return false
		}
	}
	return true
}

// maxEventType is the longest event type kept, in bytes.
const maxEventType = 255

// cleanEventType is an event's type as it is recorded, logged, traced
// and given to placeholders: the sender's text (the body's "type", or a
// provider's type header), with invalid UTF-8, control characters,
// format characters (bidi overrides and isolates, a zero-width space, a
// BOM; not the joiners, zwnj and zwj) and line and paragraph separators
// replaced by U+FFFD, cut at maxEventType bytes between characters. A
// NUL or a byte that is not UTF-8 made PostgreSQL refuse the record's
// every commit; a type of the body's size went into every record; a
// U+202E in a console log line reorders what its reader sees after it.
func cleanEventType(s string) string {
	bad := func(r rune) bool {
		return r == utf8.RuneError || unicode.IsControl(r) ||
			unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) && r != zwnj && r != zwj
	}
	if len(s) <= maxEventType && (printableASCII(s) || strings.IndexFunc(s, bad) < 0) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if bad(r) {
			r = utf8.RuneError
		}
		if b.Len()+utf8.RuneLen(r) > maxEventType {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
