package sanghodedup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/cespare/xxhash/v2"
)

// fingerprint is the body's fingerprint as this version writes it: "x"
// and the hex of the body's xxh64 (17 characters). It only has to tell
// one body from another under one event ID, of bodies already
// authenticated by the sender's signature; docs/how-it-works.md says
// why 64 bits of a non-cryptographic hash are enough for that. It costs
// a small part of the SHA-256 that older versions computed
// (BenchmarkServeBodies).
func fingerprint(body []byte) string {
	var b [1 + 2*8]byte
	b[0] = 'x'
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], xxhash.Sum64(body))
	hex.Encode(b[1:], sum[:])
	return string(b[:])
}

// sha256Fingerprint is the fingerprint older versions wrote: the hex of
// the first 16 bytes of the body's SHA-256 (32 characters).
func sha256Fingerprint(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:16])
}

// fingerprintAs returns body's fingerprint in the format of stored, a
// fingerprint found in the store, to compare with it: fp (body's own,
// see fingerprint) when stored is of this version's format; the
// SHA-256 fingerprint, computed only then, when stored was written by
// an older version (records stay for the retention, and a lease may be
// held by an older instance on a shared store); "" when stored is of a
// format this version does not know (written by a newer version): it
// says nothing, as a record written before fingerprints existed.
func fingerprintAs(stored, fp string, body []byte) string {
	switch {
	case len(stored) == len(fp) && stored[0] == fp[0]:
		return fp
	case len(stored) == 32 && isLowerHex(stored):
		return sha256Fingerprint(body)
	}
	return ""
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
