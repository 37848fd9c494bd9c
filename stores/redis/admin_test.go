package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestRedisClusterGetForget: the operators' look-up and forget reach the
// master of each key on a Cluster (keys spread over every slot).
func TestRedisClusterGetForget(t *testing.T) {
	c := redistest.StartCluster(t)
	s := provisionRedisStore(t, &Store{Address: c.Addrs()})
	ctx := context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "x", Fingerprint: "00112233445566778899aabbccddeeff"}
	for i := range 20 {
		key := testKeyPrefix + "evt_cluster_ops_" + strconv.Itoa(i)
		if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Commit(ctx, key, "tok", rec, time.Hour); err != nil {
			t.Fatal(err)
		}
		if e, err := s.Get(ctx, key); err != nil || e.State() != "done" || e.Value != rec.EncodeCompact() || time.Until(e.ExpiresAt) < 59*time.Minute {
			t.Fatalf("get %s = %+v, %v", key, e, err)
		}
		if e, deleted, err := s.Forget(ctx, key, false); err != nil || !deleted || e.State() != "done" {
			t.Fatalf("forget %s = %+v, %v, %v", key, e, deleted, err)
		}
		if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("claim after forget %s = %v, %v", key, res, err)
		}
	}
}
