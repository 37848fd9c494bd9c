package sanghodedup

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Errors of event ID extraction; each is answered 400.
var (
	errIDMissing   = errors.New("no event ID: the body has no top-level \"id\" and the event ID header is absent")
	errIDNotInBody = errors.New("the body has no top-level \"id\" (require_body_id is on: the event ID header is not signed)")
	errIDInvalid   = errors.New("event ID must be 1-255 characters of [A-Za-z0-9_-]")
	errIDMismatch  = errors.New("the body's \"id\" and the event ID header differ")
	errIDDupKey    = errors.New("the body has more than one top-level \"id\"")
	errIDNotString = errors.New("the body's top-level \"id\" is not a string")
	errIDHeaders   = errors.New("more than one event ID header")
	errBodyJSON    = errors.New("the body starts as a JSON object but is malformed")
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

// extractEvent returns the event ID and type of a delivery. The ID is
// the body's top-level "id" when the body is a JSON object that has one;
// when the header is present too they must be equal, since only the body
// is covered by the signature. Without an "id" in the body the ID is the
// header's, unless requireBodyID (then errIDNotInBody). The type is the
// body's top-level "type" when it is a string, else "".
func extractEvent(body []byte, headerIDs []string, requireBodyID bool) (event, error) {
	if len(headerIDs) > 1 {
		return event{}, errIDHeaders
	}
	headerID := ""
	if len(headerIDs) == 1 {
		headerID = headerIDs[0]
	}
	f, err := scanTopLevel(body)
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

// scanTopLevel reads the top-level "id" and "type" of a JSON object
// without unmarshaling the body: it walks the top level strictly (keys,
// colons, commas) and skips nested values by matching brackets and
// strings, so its cost is one pass over the bytes and no allocation but
// the two strings it returns. A body that is not a JSON object (empty,
// an array, not JSON at all) yields no fields and no error: the event ID
// then comes from the header. A body that starts with '{' must be a
// well-formed object, else errBodyJSON. A second top-level "id" is
// refused (errIDDupKey): JSON parsers disagree on which one wins, so the
// backend might process another ID than the one deduplicated.
func scanTopLevel(b []byte) (topLevel, error) {
	var f topLevel
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
		key, keyEsc, ok := s.str(true)
		if !ok {
			return f, errBodyJSON
		}
		s.ws()
		if s.peek() != ':' {
			return f, errBodyJSON
		}
		s.i++
		s.ws()
		isID, isType := keyIs(key, keyEsc, "id"), keyIs(key, keyEsc, "type")
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
			raw, esc, ok := s.str(true)
			if !ok {
				return f, errBodyJSON
			}
			f.id, f.hasID = decodeStr(raw, esc), true
		case isType && !typSeen && s.peek() == '"':
			raw, esc, ok := s.str(true)
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

// keyIs compares a raw JSON key with want, decoding escapes only when
// the key has any (e.g. "\u0069d" is "id").
func keyIs(raw []byte, escaped bool, want string) bool {
	if !escaped {
		return string(raw) == want
	}
	return decodeStr(raw, true) == want
}

// decodeStr turns the raw content of a JSON string into a Go string.
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

// structural marks the bytes that matter when skipping a nested value.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

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

// str reads a string at s.i and returns its raw content (between the
// quotes) and whether it holds escapes. It finds the closing quote with
// bytes.IndexByte (vectorized), so long strings cost little. With
// validate, control characters make the string malformed; strings that
// are only skipped are not validated (the backend parses them anyway).
func (s *jsonScanner) str(validate bool) (raw []byte, escaped, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	start := s.i + 1
	rest := s.b[start:]
	j := 0
	for {
		k := bytes.IndexByte(rest[j:], '"')
		if k < 0 {
			return nil, false, false
		}
		j += k
		// The quote is escaped if an odd number of backslashes precede it.
		n := 0
		for p := j - 1; p >= 0 && rest[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			break
		}
		j++
	}
	raw = rest[:j]
	escaped = bytes.IndexByte(raw, '\\') >= 0
	if validate {
		for _, c := range raw {
			if c < 0x20 {
				return nil, false, false
			}
		}
	}
	s.i = start + j + 1
	return raw, escaped, true
}

// skipValue skips one value of any kind. Nested objects and arrays are
// skipped by matching brackets and strings; scalars by their characters.
func (s *jsonScanner) skipValue() bool {
	switch c := s.peek(); c {
	case '"':
		_, _, ok := s.str(false)
		return ok
	case '{', '[':
		var stackBuf [64]byte
		stack := append(stackBuf[:0], c)
		s.i++
		for len(stack) > 0 {
			for s.i < len(s.b) && !structural[s.b[s.i]] {
				s.i++
			}
			if s.i >= len(s.b) {
				return false
			}
			switch c := s.b[s.i]; c {
			case '"':
				if _, _, ok := s.str(false); !ok {
					return false
				}
				continue
			case '{', '[':
				stack = append(stack, c)
			case '}', ']':
				open := byte('{')
				if c == ']' {
					open = '['
				}
				if stack[len(stack)-1] != open {
					return false
				}
				stack = stack[:len(stack)-1]
			}
			s.i++
		}
		return true
	default:
		start := s.i
		for s.i < len(s.b) {
			c := s.b[s.i]
			if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'E' {
				s.i++
				continue
			}
			break
		}
		return s.i > start
	}
}
