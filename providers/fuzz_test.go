package providers

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"strconv"
	"testing"
	"time"
)

// Fuzz targets. Their seed corpora are in testdata/fuzz/<name>/; .ci/run
// runs each for a short while, e.g.
//
//	go test -run '^$' -fuzz '^FuzzExtractEvent$' -fuzztime 20s .

// FuzzSignatureHeader: the parser never panics, and a header verifies
// only if one of its v1 values is the HMAC of the body.
func FuzzSignatureHeader(f *testing.F) {
	for _, v := range vectors {
		f.Add("t="+strconv.FormatInt(v.T, 10)+",v1="+v.V1, v.Body)
	}
	f.Add("t=1733140800,v0=00,v1=zz", "")
	f.Add(",,,=,t=,v1=", "{}")
	f.Fuzz(func(t *testing.T, header, body string) {
		var sh signedHeader
		err := parseSignatureHeader(header, &sh)
		if err == nil && len(sh.v1) == 0 {
			t.Fatal("parsed without a v1")
		}
		ver := newSanghoEngine([]string{secret1}, 5*time.Minute, fixedNow(1733140800))
		if ver.verify(header, []byte(body)) != nil {
			return
		}
		mac := hmac.New(sha256.New, []byte(secret1))
		mac.Write([]byte(strconv.FormatInt(sh.t, 10) + "." + body))
		want := mac.Sum(nil)
		for _, v := range sh.v1 {
			if bytes.Equal(v[:], want) {
				return
			}
		}
		t.Fatalf("%q verified without a matching v1", header)
	})
}
