package sanghodedup

// The ID scanner as it was before it was made faster (commit 4c0568b),
// kept verbatim under other names as the reference that
// TestScanMatchesReference and FuzzScanMatchesReference compare the
// current scanner with: every body must get the same answer from both.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// refScanTopLevelKey is scanTopLevel with the ID in the top-level field
// named idKey instead of "id" (the same checks apply to it: given twice,
// not a string, present in another case).
func refScanTopLevelKey(b []byte, idKey string) (topLevel, error) {
	var f topLevel
	if bytes.HasPrefix(b, []byte(utf8BOM)) {
		return f, errBodyBOM
	}
	s := refScanner{b: b}
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
		isID, isIDCase, isType := refClassifyKey(key, keyEsc, idKey)
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
			f.id, f.hasID = refDecodeStr(raw, esc), true
		case isIDCase:
			return f, errIDCaseKey
		case isType && !typSeen && s.peek() == '"':
			raw, esc, ok := s.str()
			if !ok {
				return f, errBodyJSON
			}
			f.typ, typSeen = refDecodeStr(raw, esc), true
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

// refClassifyKey tells whether a raw top-level key is idKey ("id"), idKey
// in another case (as Go's encoding/json would match it:
// bytes.EqualFold), or "type", decoding escapes only when the key has
// some and is short enough to be one of them (e.g. "\u0069d" is "id").
func refClassifyKey(raw []byte, escaped bool, idKey string) (isID, isIDCase, isType bool) {
	// A character of a matching key is at most one \uXXXX escape, or 3
	// bytes of UTF-8 (e.g. the Kelvin sign, which folds to "k").
	runes := max(len(idKey), len("type"))
	if escaped {
		if len(raw) > 6*runes {
			return false, false, false
		}
		raw = []byte(refDecodeStr(raw, true))
	}
	if len(raw) > 3*runes { // no spelling of idKey or "type" is longer
		return false, false, false
	}
	isID = string(raw) == idKey
	return isID, !isID && bytes.EqualFold(raw, []byte(idKey)), string(raw) == "type"
}

// refDecodeStr turns the raw content of a JSON string, already validated,
// into a Go string.
func refDecodeStr(raw []byte, escaped bool) string {
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

type refScanner struct {
	b []byte
	i int
}

func (s *refScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *refScanner) ws() {
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
func (s *refScanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return errBodyJSON
	}
	return nil
}

// refStrStop marks the bytes that end the fast run through a string: the
// closing quote, an escape, and the control characters JSON forbids.
var refStrStop = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// str reads a string at s.i, validating it (no control characters,
// only JSON's escapes), and returns its raw content (between the quotes)
// and whether it holds escapes.
func (s *refScanner) str() (raw []byte, escaped, ok bool) {
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
		for n := 0; i+8 <= len(b) && refStops(binary.LittleEndian.Uint64(b[i:])) == 0; n++ {
			i += 8
			if n == 3 {
				for i+32 <= len(b) && refStops(binary.LittleEndian.Uint64(b[i:]))|
					refStops(binary.LittleEndian.Uint64(b[i+8:]))|
					refStops(binary.LittleEndian.Uint64(b[i+16:]))|
					refStops(binary.LittleEndian.Uint64(b[i+24:])) == 0 {
					i += 32
				}
			}
		}
		for i < len(b) && !refStrStop[b[i]] {
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
				if i+6 > len(b) || !refIsHex(b[i+2]) || !refIsHex(b[i+3]) || !refIsHex(b[i+4]) || !refIsHex(b[i+5]) {
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
// through a string (see refStrStop).
func refStops(w uint64) uint64 { return refHasLess(w, 0x20) | refHasByte(w, '"') | refHasByte(w, '\\') }

// refHasLess reports (non-zero) whether a byte of w is below n (n <= 128);
// refHasByte whether one equals c. Classic SWAR bit tricks.
func refHasLess(w uint64, n byte) uint64 {
	return (w - 0x0101010101010101*uint64(n)) & ^w & 0x8080808080808080
}

func refHasByte(w uint64, c byte) uint64 {
	x := w ^ (0x0101010101010101 * uint64(c))
	return (x - 0x0101010101010101) & ^x & 0x8080808080808080
}

func refIsHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// skipValue skips and validates one value of any kind at s.i. Nested
// objects and arrays are walked with an explicit stack, so a deep body
// costs no recursion; with the top-level object, nesting may not exceed
// maxNesting.
func (s *refScanner) skipValue() bool {
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
func (s *refScanner) member() bool {
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

func (s *refScanner) literal(lit string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return false
	}
	s.i += len(lit)
	return true
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *refScanner) number() bool {
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

// sameScan fails t when the scanner and the reference answer body
// differently (fields or error) for any of a few ID keys.
func sameScan(t testing.TB, body []byte) {
	t.Helper()
	for _, key := range []string{"id", "event_id", "type"} {
		got, err := scanTopLevelKey(body, key)
		want, wantErr := refScanTopLevelKey(body, key)
		if got != want || err != wantErr {
			t.Fatalf("key %q, body %.300q (%d bytes):\n got  %+v, %v\n want %+v, %v", key, body, len(body), got, err, want, wantErr)
		}
		// Read up to the ID, then the rest (as ServeHTTP does): the same
		// answer as one whole read.
		split, pos, err := scanTop(body, key, true)
		if err == nil && split.partial {
			split, err = scanRest(body, key, split, pos)
		}
		if split != want || err != wantErr {
			t.Fatalf("key %q, body %.300q (%d bytes), read up to the ID then the rest:\n got  %+v, %v\n want %+v, %v", key, body, len(body), split, err, want, wantErr)
		}
	}
}

// TestScanMatchesReference gives the scanner (whole, and split at the
// ID as ServeHTTP reads a body) and the reference the same bodies: the fuzz corpus, the benchmarks' bodies, generated ones with
// strings of every length and position of escapes and control
// characters, and each of them broken in many ways (cut short, a byte
// replaced, dropped or doubled).
func TestScanMatchesReference(t *testing.T) {
	var seeds [][]byte
	files, err := filepath.Glob("testdata/fuzz/FuzzExtractEvent/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fuzz corpus: %v", err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if q, ok := strings.CutPrefix(line, "string("); ok {
				s, err := strconv.Unquote(strings.TrimSuffix(q, ")"))
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				seeds = append(seeds, []byte(s))
			}
		}
	}
	for _, s := range benchShapes {
		seeds = append(seeds, []byte(s.body("evt_shape")))
	}
	seeds = append(seeds, []byte(bodyA), []byte(bodyB), []byte(nestedBody("evt_n", 1)), []byte(nestedBody("evt_n", 3)),
		[]byte(`{"type":"first","id":"evt_t","type":"second"}`)) // the first type wins, across the split at the ID
	rng := rand.New(rand.NewPCG(27, 1))
	for range 200 {
		seeds = append(seeds, genBody(rng))
	}
	t.Logf("%d seed bodies, each also broken", len(seeds))
	special := []byte(`"\{}[],: 0-.eEtfnu` + "\x00\x01\x1f\x7f\xff\t")
	for _, body := range seeds {
		sameScan(t, body)
		if len(body) <= 600 {
			for i := range body { // every cut, and every special byte at every place
				sameScan(t, body[:i])
				for _, c := range special {
					sameScan(t, replaced(body, i, c))
				}
				sameScan(t, append(bytes.Clone(body[:i]), body[i+1:]...))
				sameScan(t, append(bytes.Clone(body[:i+1]), body[i:]...))
			}
			continue
		}
		for range 300 { // larger bodies: random places
			i := rng.IntN(len(body))
			sameScan(t, body[:i])
			sameScan(t, replaced(body, i, special[rng.IntN(len(special))]))
		}
	}
	// Strings of every length up to 80 with one special byte at every
	// position: the boundaries of the scanner's word-at-a-time loops.
	count := 0
	for n := range 72 {
		for p := range n {
			for _, c := range []byte{'"', '\\', 0x01, 0x1f, 0x7f, 0xff, 'n', 'u'} {
				v := bytes.Repeat([]byte{'x'}, n)
				v[p] = c
				sameScan(t, []byte(`{"a":"`+string(v)+`","id":"evt_1"}`))
				if p+1 < n {
					v[p], v[p+1] = '\\', c
					sameScan(t, []byte(`{"id":"evt_1","a":["`+string(v)+`"]}`))
				}
				count += 2
			}
		}
	}
	t.Logf("%d string bodies", count)
}

func replaced(b []byte, i int, c byte) []byte {
	b = bytes.Clone(b)
	b[i] = c
	return b
}

// genBody makes a JSON object body, valid most of the time, of nested
// values with random whitespace, keys (some of them "id" spelt in
// several ways), numbers, literals and strings of random length with
// escapes, control characters and non-ASCII bytes here and there.
func genBody(rng *rand.Rand) []byte {
	var b []byte
	ws := func() {
		for rng.IntN(4) == 0 {
			b = append(b, " \t\r\n"[rng.IntN(4)])
		}
	}
	str := func() {
		b = append(b, '"')
		n := rng.IntN(4)
		if rng.IntN(3) == 0 {
			n = rng.IntN(120)
		}
		for range n {
			switch r := rng.IntN(60); {
			case r == 0:
				b = append(b, `\"`...)
			case r == 1:
				b = append(b, `\\`...)
			case r == 2:
				b = append(b, `\u00e9`...)
			case r == 3:
				b = append(b, []string{`\n`, `\/`, `\b`, `\x`, `\u12`, `\uD83D`}[rng.IntN(6)]...)
			case r == 4:
				b = append(b, byte(rng.IntN(0x20)))
			case r == 5:
				b = append(b, 0x80+byte(rng.IntN(0x80)))
			default:
				b = append(b, 'a'+byte(rng.IntN(26)))
			}
		}
		b = append(b, '"')
	}
	key := func() {
		if rng.IntN(6) == 0 {
			b = append(b, []string{`"id"`, `"ID"`, `"\u0069d"`, `"type"`, `"event_id"`, `"Event_ID"`, `"i\u0044"`}[rng.IntN(7)]...)
			return
		}
		str()
	}
	var value func(depth int)
	value = func(depth int) {
		ws()
		switch r := rng.IntN(10); {
		case r < 2 && depth < 6:
			b = append(b, '{')
			for j := range rng.IntN(5) {
				if j > 0 {
					b = append(b, ',')
				}
				ws()
				key()
				ws()
				b = append(b, ':')
				value(depth + 1)
			}
			ws()
			b = append(b, '}')
		case r < 4 && depth < 6:
			b = append(b, '[')
			for j := range rng.IntN(5) {
				if j > 0 {
					b = append(b, ',')
				}
				value(depth + 1)
			}
			ws()
			b = append(b, ']')
		case r < 7:
			str()
		case r < 8:
			b = append(b, []string{"true", "false", "null"}[rng.IntN(3)]...)
		default:
			b = append(b, []string{"0", "-0", "12", "-3.25", "1e9", "6E-2", "1.5e+3", "01", "1.", "-"}[rng.IntN(10)]...)
		}
		ws()
	}
	ws()
	b = append(b, '{')
	for j := range 1 + rng.IntN(6) {
		if j > 0 {
			b = append(b, ',')
		}
		ws()
		key()
		ws()
		b = append(b, ':')
		value(0)
	}
	b = append(b, '}')
	ws()
	return b
}

// FuzzScanMatchesReference: the scanner, whole or split at the ID, and
// the reference give every body the same answer.
func FuzzScanMatchesReference(f *testing.F) {
	f.Add(bodyA)
	f.Add(nestedBody("evt_n", 2))
	f.Add(`{"a":"` + strings.Repeat(`x\"`, 40) + `","id":"evt_1"}`)
	f.Add(`{"id":"a","ID":"b"}`)
	f.Fuzz(func(t *testing.T, body string) { sameScan(t, []byte(body)) })
}
