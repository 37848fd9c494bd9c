package file

import (
	"encoding/binary"
	"errors"
	"math"
	"time"
)

// The store's keys and values in Pebble.
//
//	'd' key             -> done record: version, expiry, value
//	'x' expiry(8) key   -> (empty): the done records by expiry, for the sweeper
//	'l' key             -> a lease parked by a clean stop: version, expiry, value
//	"\x00sangho_dedup"  -> storeFormat: marks a sangho_dedup store
//
// key is the store's key (key_prefix + event ID); expiry is Unix
// nanoseconds, big-endian (so the 'x' keys sort by expiry); a value is
// one version byte (recordV1), the expiry, then the value as the other
// stores hold it ("done:{...}", "inflight:<token>").
const (
	prefixDone   = 'd'
	prefixExpiry = 'x'
	prefixLease  = 'l'
	recordV1     = 1
)

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

// expiryKey is the sweeper's index entry of key's record expiring at exp.
func expiryKey(exp uint64, key string) []byte {
	k := make([]byte, 9+len(key))
	k[0] = prefixExpiry
	binary.BigEndian.PutUint64(k[1:], exp)
	copy(k[9:], key)
	return k
}

// expiryBound is the first expiry key after every record expiring at
// or before exp.
func expiryBound(exp uint64) []byte {
	k := make([]byte, 9)
	k[0] = prefixExpiry
	binary.BigEndian.PutUint64(k[1:], exp+1)
	if exp == math.MaxUint64 {
		k[0]++
	}
	return k
}

// encodeRecord is a value on disk: the version, the expiry, the value.
func encodeRecord(exp uint64, val string) []byte {
	rec := make([]byte, 9+len(val))
	rec[0] = recordV1
	binary.BigEndian.PutUint64(rec[1:], exp)
	copy(rec[9:], val)
	return rec
}

// decodeRecord reads a value written by encodeRecord; the value shares
// raw's memory.
func decodeRecord(raw []byte) (exp uint64, val []byte, err error) {
	if len(raw) < 9 || raw[0] != recordV1 {
		return 0, nil, errBadRecord
	}
	return binary.BigEndian.Uint64(raw[1:]), raw[9:], nil
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
