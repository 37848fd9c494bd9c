// Package sangho holds what both the plugin and the tools need of
// Sangho's delivery contract: signing an event as Sangho does.
package sangho

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// Sign returns the Sangho-Signature header value for body, signed at t
// with each of secrets: `t=<unix>,v1=<hex>[,v1=<hex>...]`, one v1 per
// secret, as Sangho sends during a secret rotation.
func Sign(t time.Time, body []byte, secrets ...string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	var b strings.Builder
	b.Grow(len("t=") + len(ts) + len(secrets)*(len(",v1=")+2*sha256.Size))
	b.WriteString("t=")
	b.WriteString(ts)
	var sum [sha256.Size]byte
	var hx [2 * sha256.Size]byte
	for _, s := range secrets {
		mac := hmac.New(sha256.New, []byte(s))
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		hex.Encode(hx[:], mac.Sum(sum[:0]))
		b.WriteString(",v1=")
		b.Write(hx[:])
	}
	return b.String()
}
