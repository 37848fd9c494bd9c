package providers

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Fuzz targets. Their seeds are their f.Add calls and, where committed,
// testdata/fuzz/<name>/; .ci/run runs each for a short while, e.g.
//
//	go test -run '^$' -fuzz '^FuzzProviderSignatures$' -fuzztime 20s ./providers

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

// FuzzProviderSignatures: the providers' header parsers never panic, and
// a delivery verifies only if it carries the signature the provider
// would compute: github's hex and shopify's base64 HMAC of the body,
// the hmac provider's over its template, a Standard Webhooks v1 entry
// equal to the HMAC of `<id>.<timestamp>.<body>`.
func FuzzProviderSignatures(f *testing.F) {
	ts := strconv.FormatInt(testNow.Unix(), 10)
	f.Add(uint8(0), githubSig("Hello, World!", ghSecret1), "", "Hello, World!")
	f.Add(uint8(1), shopifySig(`{"foo": "bar"}`, ghSecret1), "", `{"foo": "bar"}`)
	f.Add(uint8(2), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1a,AAAA v2,x", "msg_p5jXN8AQM9LWM0D4loKWxJek", `{"test": 2432232314}`)
	f.Add(uint8(3), "v0="+strings.TrimPrefix(githubSig("v0:"+ts+":{}", ghSecret1), "sha256="), ts, "{}")
	f.Add(uint8(2), "  v1, ,v1 v1,==== ", "", "")
	f.Add(uint8(0), "sha256=", "", "")
	schemes := []string{
		`{"name":"github"}`,
		`{"name":"shopify"}`,
		`{"name":"standard_webhooks"}`,
		`{"name":"hmac","header":"X-Sig","prefix":"v0=","timestamp_header":"X-Ts","signed_content":"v0:{timestamp}:{body}","id_field":"id"}`,
	}
	// The Standard Webhooks secret is whsec_ + base64: its key is the
	// decoded part.
	swKey, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(swSecret1, "whsec_"))
	provs := make([]dedup.Provider, len(schemes))
	for i, s := range schemes {
		secret := ghSecret1
		if i == 2 {
			secret = swSecret1
		}
		provs[i] = newProvider(f, s, []string{secret}, testNow)
	}
	f.Fuzz(func(t *testing.T, which uint8, sig, extra, body string) {
		i := int(which) % len(schemes)
		p := provs[i]
		r := post(body, nil)
		hdr := map[int]string{0: "X-Hub-Signature-256", 1: "X-Shopify-Hmac-Sha256", 2: "Webhook-Signature", 3: "X-Sig"}[i]
		r.Header[hdr] = []string{sig}
		var want func() bool
		mac := func(key []byte, content string) []byte {
			m := hmac.New(sha256.New, key)
			m.Write([]byte(content))
			return m.Sum(nil)
		}
		switch i {
		case 0:
			want = func() bool { return strings.EqualFold(sig, "sha256="+hex.EncodeToString(mac([]byte(ghSecret1), body))) }
		case 1:
			want = func() bool { return sig == base64.StdEncoding.EncodeToString(mac([]byte(ghSecret1), body)) }
		case 2:
			r.Header["Webhook-Id"] = []string{extra}
			r.Header["Webhook-Timestamp"] = []string{ts}
			want = func() bool {
				good := "v1," + base64.StdEncoding.EncodeToString(mac(swKey, extra+"."+ts+"."+body))
				for e := range strings.SplitSeq(sig, " ") {
					if e == good {
						return true
					}
				}
				return false
			}
		case 3:
			r.Header["X-Ts"] = []string{extra}
			want = func() bool {
				return strings.EqualFold(sig, "v0="+hex.EncodeToString(mac([]byte(ghSecret1), "v0:"+extra+":"+body)))
			}
		}
		if _, err := p.Verify(r, []byte(body)); err == nil && !want() {
			t.Fatalf("provider %d verified %q (extra %q) without the provider's signature", i, sig, extra)
		}
	})
}
