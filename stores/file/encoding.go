package file

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// The store's keys and values in Pebble.
//
//	'd' key             -> done record: version, expiry, value
//	'l' key             -> a lease, live or a mark (written at its claim and renewals): version, expiry, value
//	"\x00sangho_dedup"  -> storeFormat: marks a sangho_dedup store
//
// (The layout before this one also kept 'x' expiry(8) key -> empty, an
// index by expiry for the sweeper; the sweeper deletes it at the first
// start, see sweep.go.)
//
// key is the store's key (key_prefix + event ID); expiry is Unix
// nanoseconds, big-endian; a value is one version byte, the expiry,
// then:
//
//	recordV1: the value as the other stores hold it ("done:{...}",
//	          "inflight:<token>"): leases, and a done record that
//	          recordV2 cannot give back exactly
//	recordV2: a done record, compact: processed_at as a signed varint of
//	          expiry minus processed_at (Unix nanoseconds); a uvarint of
//	          the event type's length times 2, plus 1 if a fingerprint
//	          follows; the fingerprint, 16 raw bytes; the event type; the
//	          event ID's length (uvarint) and the event ID; the
//	          fingerprint of versions before xxh64 (32 hex characters of
//	          SHA-256)
//	recordV3: the same with the xxh64 fingerprint ("x" and 16 hex
//	          characters) as 8 raw bytes
//
// Both are read back as the same "done:{...}" string (dedup.DoneRecord's
// Encode): a record is written as recordV2 or recordV3 only when that
// reading gives back its exact string.
const (
	prefixDone   = 'd'
	prefixExpiry = 'x'
	prefixLease  = 'l'
	recordV1     = 1
	recordV2     = 2
	recordV3     = 3
)

// fingerprintForm is the size of a compact record's raw fingerprint and
// the prefix of its text form, by version.
func fingerprintForm(version byte) (size int, prefix string) {
	if version == recordV3 {
		return 8, "x"
	}
	return 16, ""
}

var (
	keyFormat   = []byte("\x00sangho_dedup")
	storeFormat = []byte("file store 1")
)

// errBadRecord is a value that this version cannot read: damage, or a
// newer version's format.
var errBadRecord = errors.New("a record of an unknown format (damaged, or written by a newer version)")

func doneKey(key string) []byte  { return prefixed(prefixDone, key) }
func leaseKey(key string) []byte { return prefixed(prefixLease, key) }

func prefixed(p byte, key string) []byte {
	k := make([]byte, 1+len(key))
	k[0] = p
	copy(k[1:], key)
	return k
}

// encodeRecord is a value on disk in recordV1: the version, the expiry,
// the value.
func encodeRecord(exp uint64, val string) []byte {
	rec := make([]byte, 9+len(val))
	rec[0] = recordV1
	binary.BigEndian.PutUint64(rec[1:], exp)
	copy(rec[9:], val)
	return rec
}

// doneValue is a done record ready to be written at any expiry.
type doneValue struct {
	val  string           // recordV1's: the record as the store gives it back, "done:{...}"
	rec  dedup.DoneRecord // with body: the record as it reads back, whose Encode() is that string
	at   int64            // processed_at, Unix nanoseconds (with body)
	body []byte           // recordV2's or V3's fields after processed_at; nil: recordV1
	v    byte             // recordV2 or recordV3, with body
}

// str is the record as the store gives it back, "done:{...}". A compact
// record builds it only when asked (a retried commit compares it), not
// for every commit (newDoneValue with the encoding was 7 % of a profile
// of BenchmarkFileStoreNewEvent).
func (d doneValue) str() string {
	if d.body == nil {
		return d.val
	}
	return d.rec.Encode()
}

// newDoneValue prepares rec: compact when the compact form reads back
// as exactly rec (its str() is then rec.Encode(), the string it reads
// back as), else as the string rec.Encode().
func newDoneValue(rec dedup.DoneRecord) doneValue {
	at := rec.ProcessedAt.UnixNano()
	if at < 0 || !time.Unix(0, at).Equal(rec.ProcessedAt) {
		return doneValue{val: rec.Encode()} // before 1970 or past 2262: not from a clock
	}
	v := byte(recordV2)
	if strings.HasPrefix(rec.Fingerprint, "x") {
		v = recordV3
	}
	size, prefix := fingerprintForm(v)
	fp, err := hex.DecodeString(rec.Fingerprint[len(prefix):])
	if err != nil || (len(fp) != size && len(rec.Fingerprint) != 0) {
		return doneValue{val: rec.Encode()}
	}
	body := make([]byte, 0, 2*binary.MaxVarintLen64+len(rec.EventType)+len(rec.EventID)+len(fp))
	body = binary.AppendUvarint(body, uint64(len(rec.EventType))<<1|uint64(min(len(fp), 1)))
	body = append(body, fp...)
	body = append(body, rec.EventType...)
	body = binary.AppendUvarint(body, uint64(len(rec.EventID)))
	body = append(body, rec.EventID...)
	// Whatever the compact form would lose or change (an upper-case
	// fingerprint, a field DoneRecord gains later) keeps the record in
	// recordV1: the other layers compare the string it reads back,
	// Encode's, which the record's fields make (a comparison of the
	// fields, not a second encoding: a field DoneRecord gains is
	// compared too).
	want := rec
	want.ProcessedAt = time.Unix(0, at).UTC()
	if back, err := decodeBody(v, at, body); err != nil || back != want {
		return doneValue{val: rec.Encode()}
	}
	return doneValue{rec: want, at: at, body: body, v: v}
}

// doneValueOf prepares a done record given as its stored string (an
// earlier release's file, tests); any other value stays as it is.
func doneValueOf(val string) doneValue {
	if rec, ok := dedup.DecodeDone(val); ok {
		if d := newDoneValue(rec); d.str() == val {
			return d
		}
	}
	return doneValue{val: val}
}

// encode is d's value on disk with expiry exp.
func (d doneValue) encode(exp uint64) []byte {
	if d.body == nil || exp > math.MaxInt64 {
		return encodeRecord(exp, d.str())
	}
	rec := make([]byte, 9, 9+binary.MaxVarintLen64+len(d.body))
	rec[0] = d.v
	binary.BigEndian.PutUint64(rec[1:], exp)
	rec = binary.AppendVarint(rec, int64(exp)-d.at)
	return append(rec, d.body...)
}

// decodeBody reads the fields after processed_at of a record of
// version v (recordV2 or recordV3).
func decodeBody(v byte, at int64, b []byte) (dedup.DoneRecord, error) {
	size, prefix := fingerprintForm(v)
	rec := dedup.DoneRecord{ProcessedAt: time.Unix(0, at).UTC()}
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return dedup.DoneRecord{}, errBadRecord
	}
	b = b[k:]
	if n&1 == 1 {
		if len(b) < size {
			return dedup.DoneRecord{}, errBadRecord
		}
		rec.Fingerprint, b = prefix+hex.EncodeToString(b[:size]), b[size:]
	}
	var ok bool
	if rec.EventType, b, ok = cutBytes(b, n>>1); !ok {
		return dedup.DoneRecord{}, errBadRecord
	}
	if n, k = binary.Uvarint(b); k <= 0 {
		return dedup.DoneRecord{}, errBadRecord
	}
	if rec.EventID, b, ok = cutBytes(b[k:], n); !ok || len(b) != 0 {
		return dedup.DoneRecord{}, errBadRecord
	}
	return rec, nil
}

// cutBytes returns the first n bytes of b and the rest.
func cutBytes(b []byte, n uint64) (s string, rest []byte, ok bool) {
	if n > uint64(len(b)) {
		return "", nil, false
	}
	return string(b[:n]), b[n:], true
}

// decodeExpiry reads only the expiry of a value on disk.
func decodeExpiry(raw []byte) (uint64, error) {
	if len(raw) < 9 || (raw[0] != recordV1 && raw[0] != recordV2 && raw[0] != recordV3) {
		return 0, errBadRecord
	}
	return binary.BigEndian.Uint64(raw[1:]), nil
}

// decodeRecord reads a value on disk: its expiry, and the value as the
// other stores hold it.
func decodeRecord(raw []byte) (exp uint64, val string, err error) {
	if exp, err = decodeExpiry(raw); err != nil {
		return 0, "", err
	}
	if raw[0] == recordV1 {
		return exp, string(raw[9:]), nil
	}
	d, k := binary.Varint(raw[9:])
	at := int64(exp) - d
	if k <= 0 || exp > math.MaxInt64 || at < 0 || (d < 0 && at < int64(exp)) {
		return 0, "", errBadRecord
	}
	rec, err := decodeBody(raw[0], at, raw[9+k:])
	if err != nil {
		return 0, "", err
	}
	return exp, rec.Encode(), nil
}

// decodeAnswer reads a value on disk as a claim answers with it: a
// compact done record (recordV2, recordV3) with a fingerprint and no
// event ID straight into dedup's compact form (DoneRecord.EncodeCompact:
// the "done:" prefix, the fingerprint's raw bytes, processed_at in
// milliseconds, the event type), with no JSON to build; what that form
// cannot hold as it is, and every other value, as decodeRecord reads it.
// A duplicate's claim is the store's hot read, and its caller reads
// only the fingerprint (dedup.Fingerprint) and, in a replay record, the
// event ID (kept: such records stay JSON); Get gives the record back
// exactly, processed_at to the nanosecond.
func decodeAnswer(raw []byte) (exp uint64, val string, err error) {
	if len(raw) < 9 || (raw[0] != recordV2 && raw[0] != recordV3) {
		return decodeRecord(raw)
	}
	exp = binary.BigEndian.Uint64(raw[1:])
	d, k := binary.Varint(raw[9:])
	at := int64(exp) - d
	if k <= 0 || exp > math.MaxInt64 || at < 0 || (d < 0 && at < int64(exp)) {
		return 0, "", errBadRecord
	}
	b := raw[9+k:]
	n, k := binary.Uvarint(b)
	size, _ := fingerprintForm(raw[0])
	ms := at / 1e6
	if k <= 0 || n&1 == 0 || ms >= 1<<48 || uint64(len(b)-k) < uint64(size)+n>>1+1 || b[k+size+int(n>>1)] != 0 || len(b) != k+size+int(n>>1)+1 {
		return decodeRecord(raw) // no fingerprint, an event ID, or damage (which decodeRecord reports)
	}
	version := byte(dedup.CompactV1)
	if raw[0] == recordV3 {
		version = dedup.CompactV2
	}
	var out strings.Builder // one allocation
	out.Grow(len(dedup.DonePrefix) + 1 + 6 + size + int(n>>1))
	out.WriteString(dedup.DonePrefix)
	out.Write([]byte{version, byte(ms >> 40), byte(ms >> 32), byte(ms >> 24), byte(ms >> 16), byte(ms >> 8), byte(ms)})
	out.Write(b[k : k+size+int(n>>1)]) // the fingerprint's bytes, then the event type
	return exp, out.String(), nil
}

// unixNano is t in Unix nanoseconds as the store keeps expiries,
// saturated: a time past the last that int64 nanoseconds can hold (in
// the year 2262) is that last one, never wrapped into the past, so a
// long ttl cannot turn into an expired record.
func unixNano(t time.Time) uint64 {
	switch {
	case t.After(lastUnixNano):
		return math.MaxInt64
	case t.Before(time.Unix(0, 0)):
		return 0
	}
	return uint64(t.UnixNano())
}

var lastUnixNano = time.Unix(0, math.MaxInt64)

// unixTime is the time of an expiry read from the store. Past the year
// 2262 it is the last time unixNano writes. (bbolt files of versions
// before the saturation hold such expiries as their int64 bits; read
// unsigned, those are in the future too, as they were meant to be.)
func unixTime(exp uint64) time.Time {
	if exp > math.MaxInt64 {
		return lastUnixNano
	}
	return time.Unix(0, int64(exp))
}
