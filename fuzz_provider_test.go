package sanghodedup

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

// FuzzProviderSignatures: the schemes' header parsers never panic, and
// a delivery verifies only if it carries the signature the provider
// would compute: github's hex and shopify's base64 HMAC of the body,
// the hmac provider's over its template, a Standard Webhooks v1 entry
// equal to the HMAC of `<id>.<timestamp>.<body>`.
func FuzzProviderSignatures(f *testing.F) {
	ts := strconv.FormatInt(testNow.Unix(), 10)
	f.Add(uint8(0), githubSig("Hello, World!", ghSecret1), "", "Hello, World!")
	f.Add(uint8(1), shopifySig(`{"foo": "bar"}`, ghSecret1), "", `{"foo": "bar"}`)
	f.Add(uint8(2), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1a,AAAA v2,x", "msg_p5jXN8AQM9LWM0D4loKWxJek", `{"test": 2432232314}`)
	f.Add(uint8(3), "v0="+hmacWith(ghSecret1, "v0:"+ts+":{}"), ts, "{}")
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
	handlers := make([]*Handler, len(schemes))
	for i, s := range schemes {
		secret := ghSecret1
		if i == 2 {
			secret = swSecret1
		}
		handlers[i] = providerHandler(f, s, []string{secret}, nil)
	}
	f.Fuzz(func(t *testing.T, which uint8, sig, extra, body string) {
		i := int(which) % len(schemes)
		h := handlers[i]
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
		if _, err := h.provider.Verify(r, []byte(body)); err == nil && !want() {
			t.Fatalf("provider %d verified %q (extra %q) without the provider's signature", i, sig, extra)
		}
	})
}
