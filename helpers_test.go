package sanghodedup

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// startRedis starts a real redis-server on a free loopback port for one
// test (stopped at cleanup), or fails the test if there is none.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

func freePort(t testing.TB) int { return netkit.FreePort(t) }

// waitFor waits for cond, at most 10 s (poll.Until).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}

// logEntries reads a Caddy log file written as JSON and returns its
// lines decoded (a line that is not JSON left out), and its text.
func logEntries(t *testing.T, path string) (entries []map[string]any, text string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil {
			entries = append(entries, e)
		}
	}
	return entries, string(b)
}
