package redis

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/faultproxy"
)

// setOf matches `SET key <prefix>...`, the claim (inflight:) or the
// commit (done:).
func setOf(prefix string) func(faultproxy.Command) bool {
	return func(c faultproxy.Command) bool {
		return len(c) >= 3 && bytes.EqualFold(c[0], []byte("set")) && bytes.HasPrefix(c[2], []byte(prefix))
	}
}

// scriptCall matches a Lua script's call (EVAL or EVALSHA).
func scriptCall(c faultproxy.Command) bool {
	return len(c) >= 1 && (bytes.EqualFold(c[0], []byte("evalsha")) || bytes.EqualFold(c[0], []byte("eval")))
}

// TestRedisReplyLost: the connection is reset right after a claim, a
// commit, then a release reached Redis, before the reply came back: the
// command landed but the client saw an error. go-redis sends it again on
// a new connection; the claim must then recognise its own lease
// (dedup.Claimed, not dedup.InFlight, which would leave the lease to
// expire with nobody holding it), the commit its own record (held), and
// the release its own deletion (released).
func TestRedisReplyLost(t *testing.T) {
	for _, pipeline := range []bool{true, false} {
		name := map[bool]string{true: "pipeline on", false: "pipeline off"}[pipeline]
		t.Run(name, func(t *testing.T) {
			srv := startRedis(t)
			px, err := faultproxy.Start(srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { px.Close() })
			s := provisionRedisStore(t, &Store{Address: []string{px.Addr()}, DisablePipeline: !pipeline})
			ctx := context.Background()
			if _, _, err := s.Claim(ctx, "warm", "tok0", time.Minute); err != nil {
				t.Fatal(err)
			}

			px.ResetAfter(1, setOf(dedup.InFlightPrefix))
			res, _, err := s.Claim(ctx, "k", "tok", time.Minute)
			if px.Resets() != 1 {
				t.Fatalf("the claim's connection was not reset (%d resets)", px.Resets())
			}
			if err != nil || res != dedup.Claimed {
				t.Fatalf("claim whose reply was lost: %v, %v; want claimed", res, err)
			}

			px.ResetAfter(1, setOf(dedup.DonePrefix))
			held, err := s.Commit(ctx, "k", "tok", dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "t"}, time.Hour)
			if px.Resets() != 2 {
				t.Fatalf("the commit's connection was not reset (%d resets)", px.Resets())
			}
			if err != nil || !held {
				t.Fatalf("commit whose reply was lost: held %v, %v; want held", held, err)
			}
			if v, _ := srv.Client(t).Get(ctx, "k").Result(); !strings.HasPrefix(v, dedup.DonePrefix) {
				t.Fatalf("stored %q, want the done record", v)
			}

			// A release sent again finds no key: its first sending deleted
			// the lease. That is released, not a lease lost (which the
			// handler logs and counts, and an alert pages for; found by
			// review).
			if _, _, err := s.Claim(ctx, "r", "tok", time.Minute); err != nil {
				t.Fatal(err)
			}
			px.ResetAfter(1, scriptCall)
			released, err := s.Release(ctx, "r", "tok")
			if px.Resets() != 3 {
				t.Fatalf("the release's connection was not reset (%d resets)", px.Resets())
			}
			if err != nil || !released {
				t.Fatalf("release whose reply was lost: released %v, %v; want released", released, err)
			}
			if v, _ := srv.Client(t).Get(ctx, "r").Result(); v != "" {
				t.Fatalf("stored %q after the release, want nothing", v)
			}
		})
	}
}
