package providers

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// The known-answer vectors of ../shared/sangho-webhooks.md.
const (
	bodyA   = sangho.BodyA
	bodyB   = sangho.BodyB
	secret1 = sangho.Secret1
	secret2 = sangho.Secret2
)

var vectors = sangho.Vectors

func fixedNow(sec int64) func() time.Time { return func() time.Time { return time.Unix(sec, 0) } }

func TestBodiesMatchTheContract(t *testing.T) {
	if len(bodyA) != 167 || len(bodyB) != 89 {
		t.Fatalf("body lengths %d and %d, the contract says 167 and 89", len(bodyA), len(bodyB))
	}
}

func TestKnownAnswerVectors(t *testing.T) {
	for i, v := range vectors {
		hdr := "t=" + itoa(v.T) + ",v1=" + v.V1
		ver := newSanghoEngine([]string{v.Secret}, 5*time.Minute, fixedNow(v.T))
		if err := ver.verify(hdr, []byte(v.Body)); err != nil {
			t.Errorf("vector %d: %v", i, err)
		}
		if got := sangho.Sign(time.Unix(v.T, 0), []byte(v.Body), v.Secret); got != hdr {
			t.Errorf("vector %d: Sign = %q, want %q", i, got, hdr)
		}
		// One byte more, or another secret, must fail.
		if err := ver.verify(hdr, []byte(v.Body+" ")); !errors.Is(err, errSigMismatch) {
			t.Errorf("vector %d with a changed body: %v, want mismatch", i, err)
		}
		other := newSanghoEngine([]string{v.Secret + "x"}, 5*time.Minute, fixedNow(v.T))
		if err := other.verify(hdr, []byte(v.Body)); !errors.Is(err, errSigMismatch) {
			t.Errorf("vector %d with another secret: %v, want mismatch", i, err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestRotation(t *testing.T) {
	const ts = 1733140800
	v1old, v1new := vectors[0].V1, vectors[1].V1
	both := newSanghoEngine([]string{secret1, secret2}, 5*time.Minute, fixedNow(ts))
	onlyOld := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(ts))
	onlyNew := newSanghoEngine([]string{secret2}, 5*time.Minute, fixedNow(ts))
	cases := []struct {
		name string
		ver  *sanghoEngine
		hdr  string
		ok   bool
	}{
		{"sender sends old and new, receiver holds old", onlyOld, "t=1733140800,v1=" + v1old + ",v1=" + v1new, true},
		{"sender sends old and new, receiver holds new", onlyNew, "t=1733140800,v1=" + v1old + ",v1=" + v1new, true},
		{"sender sends new first", onlyOld, "t=1733140800,v1=" + v1new + ",v1=" + v1old, true},
		{"receiver holds both, sender sends old", both, "t=1733140800,v1=" + v1old, true},
		{"receiver holds both, sender sends new", both, "t=1733140800,v1=" + v1new, true},
		{"receiver holds new only, sender sends old only", onlyNew, "t=1733140800,v1=" + v1old, false},
		{"v0 is ignored, v1 matches", onlyOld, "t=1733140800,v0=" + strings.Repeat("0", 64) + ",v1=" + v1old, true},
		{"a matching v0 is not enough", onlyOld, "t=1733140800,v0=" + v1old, false},
		{"future schemes ignored", onlyOld, "v9=abc,t=1733140800,v1=" + v1old + ",scheme=x", true},
		{"spaces around pairs", onlyOld, " t=1733140800 , v1=" + v1old + " ", true},
	}
	for _, c := range cases {
		err := c.ver.verify(c.hdr, []byte(bodyA))
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}

func TestTolerance(t *testing.T) {
	const ts = 1733140800
	hdr := "t=1733140800,v1=" + vectors[0].V1
	for _, c := range []struct {
		now int64
		ok  bool
	}{
		{ts, true},
		{ts + 300, true},  // 5 minutes late: the edge is inside
		{ts - 300, true},  // 5 minutes early (sender's clock ahead)
		{ts + 301, false}, // replay after the window
		{ts - 301, false}, // too far in the future
		{ts + 86400, false},
	} {
		ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(c.now))
		err := ver.verify(hdr, []byte(bodyA))
		if c.ok && err != nil || !c.ok && !errors.Is(err, errSigTimestamp) {
			t.Errorf("now = t%+d: err = %v, want ok=%v", c.now-ts, err, c.ok)
		}
	}
	ver := newSanghoEngine([]string{secret1}, time.Hour, fixedNow(ts+3000))
	if err := ver.verify(hdr, []byte(bodyA)); err != nil {
		t.Errorf("tolerance 1h, 50 minutes off: %v", err)
	}
}

// TestToleranceIsExact: the tolerance is compared as the duration it
// is, not cut to whole seconds (500ms used to become 0 s, 1.9s 1 s).
func TestToleranceIsExact(t *testing.T) {
	const ts = 1733140800
	hdr := "t=1733140800,v1=" + vectors[0].V1
	signed := time.Unix(ts, 0)
	for _, c := range []struct {
		tolerance, off time.Duration // off: this server's clock minus t
		ok             bool
	}{
		{500 * time.Millisecond, 0, true},
		{500 * time.Millisecond, 400 * time.Millisecond, true},
		{500 * time.Millisecond, -400 * time.Millisecond, true},
		{500 * time.Millisecond, 500 * time.Millisecond, true},
		{500 * time.Millisecond, 600 * time.Millisecond, false},
		{500 * time.Millisecond, -600 * time.Millisecond, false},
		{1900 * time.Millisecond, 1800 * time.Millisecond, true},
		{1900 * time.Millisecond, -1800 * time.Millisecond, true},
		{1900 * time.Millisecond, 1950 * time.Millisecond, false},
		{1900 * time.Millisecond, -1950 * time.Millisecond, false},
		{5 * time.Minute, 5*time.Minute + time.Millisecond, false},
		{5 * time.Minute, -5*time.Minute - time.Millisecond, false},
	} {
		ver := newSanghoEngine([]string{secret1}, c.tolerance, func() time.Time { return signed.Add(c.off) })
		err := ver.verify(hdr, []byte(bodyA))
		if c.ok && err != nil || !c.ok && !errors.Is(err, errSigTimestamp) {
			t.Errorf("tolerance %v, clock t%+v: err = %v, want ok=%v", c.tolerance, c.off, err, c.ok)
		}
	}
	// t far beyond any time.Time arithmetic: refused, no overflow.
	ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(ts))
	if err := ver.verify("t=999999999999999999,v1="+vectors[0].V1, []byte(bodyA)); !errors.Is(err, errSigTimestamp) {
		t.Errorf("t=999999999999999999: %v", err)
	}
}

func TestMalformedSignatureHeaders(t *testing.T) {
	good := vectors[0].V1
	ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(1733140800))
	cases := map[string]error{
		"":                                         errSigMissing,
		"garbage":                                  errSigMalformed,
		"t=1733140800":                             errSigMalformed, // no v1
		"v1=" + good:                               errSigMalformed, // no t
		"t=1733140800,t=1733140800,v1=" + good:     errSigMalformed, // two t
		"t=-1733140800,v1=" + good:                 errSigMalformed,
		"t=+1733140800,v1=" + good:                 errSigMalformed,
		"t=17331408e2,v1=" + good:                  errSigMalformed,
		"t=,v1=" + good:                            errSigMalformed,
		"t=99999999999999999999999,v1=" + good:     errSigMalformed, // overflows int64
		"t=1733140800,v1=" + good[:63]:             errSigMalformed,
		"t=1733140800,v1=" + good + "00":           errSigMalformed,
		"t=1733140800,v1=" + strings.ToUpper(good): nil, // hex decoding accepts upper case
		"t=1733140800,v1=" + good[:62] + "zz":      errSigMalformed,
		"t=1733140800,,v1=" + good:                 errSigMalformed,
		"t=1733140800,=x,v1=" + good:               errSigMalformed,
		"t=1733140800;v1=" + good:                  errSigMalformed,
		"t=999999999999999999,v1=" + good:          errSigTimestamp, // huge but parseable
		"t=0,v1=" + good:                           errSigTimestamp,
	}
	for hdr, want := range cases {
		err := ver.verify(hdr, []byte(bodyA))
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Errorf("%q: err = %v, want %v", hdr, err, want)
		}
	}
}

func TestThousandsOfV1(t *testing.T) {
	ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(1733140800))
	hdr := "t=1733140800" + strings.Repeat(",v1="+strings.Repeat("ab", 32), 5000)
	if err := ver.verify(hdr, []byte(bodyA)); !errors.Is(err, errSigMismatch) {
		t.Fatalf("5000 wrong v1: %v", err)
	}
	if err := ver.verify(hdr+",v1="+vectors[0].V1, []byte(bodyA)); err != nil {
		t.Fatalf("5000 wrong v1 and a right one: %v", err)
	}
}

func TestErrorsCarryNoSecretOrSignature(t *testing.T) {
	ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(1733140800))
	for _, hdr := range []string{"t=1733140800,v1=" + vectors[1].V1, "t=1,v1=" + vectors[0].V1, "t=x,v1=" + vectors[0].V1,
		// A v1 cut short, one too long, or with a stray character: a
		// signature value all the same, which must not reach the log.
		"t=1733140800,v1=" + vectors[0].V1[:63], "t=1733140800,v1=" + vectors[0].V1 + "0", "t=1733140800,v1=" + vectors[0].V1[:63] + "z",
		"t=1733140800,v1=" + vectors[1].V1 + ",v1=" + vectors[0].V1[:40]} {
		err := ver.verify(hdr, []byte(bodyA))
		if err == nil {
			t.Fatalf("%q verified", hdr)
		}
		msg := err.Error()
		if strings.Contains(msg, secret1) || strings.Contains(msg, vectors[0].V1[:16]) || strings.Contains(msg, vectors[1].V1[:16]) {
			t.Fatalf("error %q leaks a secret or a signature", msg)
		}
	}
}

// TestEveryByteOfV1IsCompared: a v1 that differs from the right one in
// its last byte only, or in any one byte, is refused; and a v1 holding
// a character that is not hex is malformed, not another spelling of a
// byte.
func TestEveryByteOfV1IsCompared(t *testing.T) {
	good := vectors[0].V1
	ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(1733140800))
	for i := 0; i < len(good); i += 2 {
		b := []byte(good)
		b[i+1] = "1032547698badcfe"[strings.IndexByte("0123456789abcdef", b[i+1])] // flip the low bit of byte i/2
		if err := ver.verify("t=1733140800,v1="+string(b), []byte(bodyA)); !errors.Is(err, errSigMismatch) {
			t.Errorf("v1 with byte %d changed: %v, want a mismatch", i/2, err)
		}
	}
	for _, c := range []byte("gGxX/:@`") {
		hdr := "t=1733140800,v1=" + good[:63] + string(c)
		if err := ver.verify(hdr, []byte(bodyA)); !errors.Is(err, errSigMalformed) {
			t.Errorf("v1 ending in %q: %v, want malformed", c, err)
		}
	}
}
