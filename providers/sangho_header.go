package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sigHexLen is the length of a hex-encoded HMAC-SHA256.
const sigHexLen = sha256.Size * 2

// signedHeader is the parsed form of a Sangho-Signature header:
// exactly one t, and zero or more decoded v1 values. Other keys are
// ignored, as the delivery contract requires.
type signedHeader struct {
	t     int64
	v1    [][sha256.Size]byte
	v1buf [2][sha256.Size]byte // room for the usual one or two, without allocating
}

// parseSignatureHeader parses `t=<unix>,v1=<hex>[,v1=<hex>...]`.
// A v1 that is not 64 hex digits makes the whole header malformed:
// Sangho never sends one, so it is a forgery or a bug, not a rotation.
func parseSignatureHeader(value string, sh *signedHeader) error {
	sh.v1 = sh.v1buf[:0]
	if value == "" {
		return errSigMissing
	}
	seenT := false
	for value != "" {
		var pair string
		pair, value, _ = strings.Cut(value, ",")
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return errSigMalformed
		}
		switch k {
		case "t":
			if seenT || !isDigits(v) || len(v) > 18 {
				return errSigMalformed
			}
			t, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return errSigMalformed
			}
			sh.t, seenT = t, true
		case "v1":
			var sig [sha256.Size]byte
			if len(v) != sigHexLen || !decodeHex(sig[:], v) {
				return errSigMalformed
			}
			sh.v1 = append(sh.v1, sig)
		case "":
			return errSigMalformed
		default:
			// v0 and future schemes are ignored.
		}
	}
	if !seenT || len(sh.v1) == 0 {
		return errSigMalformed
	}
	return nil
}

// decodeHex decodes the hex string src into dst (len(src) == 2*len(dst)),
// upper or lower case, without converting src to a byte slice.
func decodeHex(dst []byte, src string) bool {
	for i := range dst {
		hi, ok1 := fromHex(src[2*i])
		lo, ok2 := fromHex(src[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func fromHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// sanghoEngine checks Sangho-Signature headers against a set of secrets.
// It keeps a pool of HMAC states per secret so that verification does
// not allocate a new hash for every request.
type sanghoEngine struct {
	tolerance time.Duration
	now       func() time.Time
	macs      []*sync.Pool // one per secret, each yielding hash.Hash
}

func newSanghoEngine(secrets []string, tolerance time.Duration, now func() time.Time) *sanghoEngine {
	v := &sanghoEngine{tolerance: tolerance, now: now}
	for _, s := range secrets {
		key := []byte(s)
		v.macs = append(v.macs, &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }})
	}
	return v
}

// verify returns nil when header carries a t within tolerance and at
// least one v1 equal to HMAC-SHA256(secret, t + "." + body) for at least
// one secret. Comparisons are constant-time.
func (v *sanghoEngine) verify(header string, body []byte) error {
	_, err := v.check(header, body)
	return err
}

// check is verify, and returns the signed timestamp t.
func (v *sanghoEngine) check(header string, body []byte) (int64, error) {
	var sh signedHeader
	if err := parseSignatureHeader(header, &sh); err != nil {
		return 0, err
	}
	// Exact: the tolerance is not cut to whole seconds. time.Time.Sub
	// saturates, so a t far in the past or future cannot overflow.
	if d := v.now().Sub(time.Unix(sh.t, 0)); d > v.tolerance || d < -v.tolerance {
		return 0, errSigTimestamp
	}
	var tbuf [20]byte
	ts := strconv.AppendInt(tbuf[:0], sh.t, 10)
	ts = append(ts, '.')
	var sum [sha256.Size]byte
	matched := 0
	for _, pool := range v.macs {
		mac := pool.Get().(hash.Hash)
		mac.Reset()
		mac.Write(ts)
		mac.Write(body)
		mac.Sum(sum[:0])
		pool.Put(mac)
		for i := range sh.v1 {
			// Every pair is compared, so timing does not tell which
			// secret or which v1 matched.
			matched |= subtle.ConstantTimeCompare(sum[:], sh.v1[i][:])
		}
	}
	if matched == 0 {
		return 0, errSigMismatch
	}
	return sh.t, nil
}
