package sanghodedup

// The validating JSON scanner under the event ID's scan (eventid.go):
// strings, escapes, numbers, literals and nesting checked as
// encoding/json.Valid does, in one pass with no call per byte and no
// allocation.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/bits"
)

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

func (s *jsonScanner) ws() { s.i = skipWS(s.b, s.i) }

// skipWS returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipWS(b []byte, i int) int {
	for i < len(b) && b[i] <= ' ' && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// end accepts only trailing whitespace after the object.
func (s *jsonScanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return errBodyJSON
	}
	return nil
}

// str reads a string at s.i, validating it (no control characters,
// only JSON's escapes), and returns its raw content (between the quotes)
// and whether it holds escapes.
func (s *jsonScanner) str() (raw []byte, escaped, ok bool) {
	if s.peek() != '"' {
		return nil, false, false
	}
	end, escaped, ok := skipStr(s.b, s.i+1)
	if !ok {
		return nil, false, false
	}
	raw, s.i = s.b[s.i+1:end-1], end
	return raw, escaped, true
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

// skipStr validates the string whose content starts at i (after its
// opening quote) and returns the index after its closing quote and
// whether it holds escapes. Short strings (keys, most values) are
// walked 8 bytes at a time: one word tells whether any of its bytes is
// a quote, a backslash or a control character, and which comes first
// (strStops). Past 32 bytes the closing quote is found with
// bytes.IndexByte (vectorised), the run before it is checked for
// control characters 8 bytes at a time and for escapes with
// bytes.IndexByte again, so a long string costs a few passes at memory
// speed instead of a branch per byte.
func skipStr(b []byte, i int) (end int, escaped, ok bool) {
	for n := 0; n < 4 && i+8 <= len(b); {
		m := strStops(binary.LittleEndian.Uint64(b[i:]))
		if m == 0 {
			i += 8
			n++
			continue
		}
		i += bits.TrailingZeros64(m) >> 3
		switch b[i] {
		case '"':
			return i + 1, escaped, true
		case '\\':
			if i = skipEscape(b, i); i < 0 {
				return 0, false, false
			}
			escaped = true
		default: // a control character
			return 0, false, false
		}
	}
	if i+8 > len(b) { // the body's last few bytes
		for ; i < len(b); i++ {
			if c := b[i]; strStop[c] {
				switch c {
				case '"':
					return i + 1, escaped, true
				case '\\':
					if i = skipEscape(b, i); i < 0 {
						return 0, false, false
					}
					i-- // the loop's i++
					escaped = true
				default:
					return 0, false, false
				}
			}
		}
		return 0, false, false
	}
	q := -1 // the next quote at or after i, once looked for
	for {
		if i > q {
			// A new run up to the next quote: it must hold no control
			// character, whether that quote ends the string or is escaped.
			n := bytes.IndexByte(b[i:], '"')
			if n < 0 {
				return 0, false, false
			}
			if hasCtrl(b[i : i+n]) {
				return 0, false, false
			}
			q = i + n
		}
		e := bytes.IndexByte(b[i:q], '\\')
		if e < 0 {
			return q + 1, escaped, true
		}
		if i = skipEscape(b, i+e); i < 0 {
			return 0, false, false
		}
		escaped = true
	}
}

// skipEscape validates the escape at b[i] == '\\' and returns the
// index after it, or -1.
func skipEscape(b []byte, i int) int {
	if i+1 >= len(b) {
		return -1
	}
	switch b[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return i + 2
	case 'u':
		if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
			return -1
		}
		return i + 6
	}
	return -1
}

// hasCtrl reports whether b holds a byte below 0x20, 32 then 8 bytes at
// a time (hasLess is exact for "some byte is below n", n <= 128).
func hasCtrl(b []byte) bool {
	for len(b) >= 32 {
		if hasLess(binary.LittleEndian.Uint64(b), 0x20)|hasLess(binary.LittleEndian.Uint64(b[8:]), 0x20)|
			hasLess(binary.LittleEndian.Uint64(b[16:]), 0x20)|hasLess(binary.LittleEndian.Uint64(b[24:]), 0x20) != 0 {
			return true
		}
		b = b[32:]
	}
	for len(b) >= 8 {
		if hasLess(binary.LittleEndian.Uint64(b), 0x20) != 0 {
			return true
		}
		b = b[8:]
	}
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// strStops marks (0x80) the bytes of w, little-endian, that stop a run
// through a string: '"', '\\' and those below 0x20. Only the lowest
// mark is exact (a borrow may mark a byte above it), and it is the only
// one skipStr reads: the first stop in the word.
func strStops(w uint64) uint64 {
	const lo = 0x0101010101010101
	q, s := w^(lo*'"'), w^(lo*'\\')
	return ((q-lo)&^q | (s-lo)&^s | (w-lo*0x20)&^w) & 0x8080808080808080 // the last: hasLess(w, 0x20)
}

// hasLess reports (non-zero) whether a byte of w is below n (n <= 128).
// A classic SWAR bit trick.
func hasLess(w uint64, n byte) uint64 {
	return (w - 0x0101010101010101*uint64(n)) & ^w & 0x8080808080808080
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// skipValue skips and validates one value of any kind at s.i.
func (s *jsonScanner) skipValue() bool {
	i, ok := skipValue(s.b, s.i)
	s.i = i
	return ok
}

// skipValue skips and validates one value of any kind at i and returns
// the index after it. Nested objects and arrays are walked with an
// explicit stack, so a deep body costs no recursion; with the top-level
// object, nesting may not exceed maxNesting. One loop over local
// indexes, with no call per byte: the cost of a body of many small
// values (a push of 185 commits) is the number of its tokens.
func skipValue(b []byte, i int) (int, bool) {
	var stackBuf [64]byte
	stack := stackBuf[:0]
	for {
		// A value is expected at i.
		i = skipWS(b, i)
		if i >= len(b) {
			return i, false
		}
		switch c := b[i]; c {
		case '{', '[':
			if len(stack)+1 >= maxNesting { // +1: the top-level object
				return i, false
			}
			i = skipWS(b, i+1)
			if i < len(b) && b[i] == c+2 { // '{'+2 is '}', '['+2 is ']'
				i++
				break
			}
			stack = append(stack, c)
			if c == '{' {
				var ok bool
				if i, ok = member(b, i); !ok {
					return i, false
				}
			}
			continue
		case '"':
			end, _, ok := skipStr(b, i+1)
			if !ok {
				return i, false
			}
			i = end
		case 't':
			if len(b)-i < 4 || string(b[i:i+4]) != "true" {
				return i, false
			}
			i += 4
		case 'f':
			if len(b)-i < 5 || string(b[i:i+5]) != "false" {
				return i, false
			}
			i += 5
		case 'n':
			if len(b)-i < 4 || string(b[i:i+4]) != "null" {
				return i, false
			}
			i += 4
		default:
			var ok bool
			if i, ok = number(b, i); !ok {
				return i, false
			}
		}
		// A value ended: close what it ends, or go on to the next one.
		for {
			if len(stack) == 0 {
				return i, true
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, false
			}
			open, c := stack[len(stack)-1], b[i]
			if c == ',' {
				i++
				if open == '{' {
					var ok bool
					if i, ok = member(b, i); !ok {
						return i, false
					}
				}
				break
			}
			if c != open+2 {
				return i, false
			}
			i++
			stack = stack[:len(stack)-1]
		}
	}
}

// member reads the key and colon of an object member at i, up to its
// value.
func member(b []byte, i int) (int, bool) {
	i = skipWS(b, i)
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, _, ok := skipStr(b, i+1)
	if !ok {
		return i, false
	}
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return i + 1, true
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at i.
func number(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return i, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return i, false
		}
		i = j
	}
	return i, true
}

// digits returns the index after the run of digits at i.
func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
