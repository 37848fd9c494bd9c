package sanghodedup

import (
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// startRedis starts a real redis-server on a free loopback port for one
// test (stopped at cleanup), or fails the test if there is none.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

func freePort(t testing.TB) int { return netkit.FreePort(t) }

// waitFor polls cond until it holds, and fails the test if it does not
// within 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
