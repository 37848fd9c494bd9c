package providers

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// Benchmarks of the hot path. Compare side by side in one run:
//
//	go test -run '^$' -bench . -benchmem -count 5 . | tee new.txt
//
// The Redis ones start their own redis-server on a free loopback port.

func BenchmarkVerify(b *testing.B) {
	for _, size := range []int{len(bodyA), 64 << 10} {
		body := []byte(bodyA)
		if size > len(body) {
			body = []byte(`{"id":"evt_1","pad":"` + strings.Repeat("x", size-22) + `"}`)
		}
		hdr := sangho.Sign(time.Unix(1733140800, 0), body, secret2, secret1)
		ver := newSanghoEngine([]string{secret1}, 5*time.Minute, func() time.Time { return time.Unix(1733140800, 0) })
		b.Run(strconv.Itoa(len(body))+"B", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := ver.verify(hdr, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
