package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/redistest"
)

// TestRedisClusterOneAddress: `cluster` makes one address (a managed
// cluster's configuration endpoint) a Redis Cluster: every claim of keys
// spread over every slot succeeds. Treated as a standalone server, the
// node answers MOVED for the keys of the other masters' slots.
func TestRedisClusterOneAddress(t *testing.T) {
	c := redistest.StartCluster(t)
	ctx := context.Background()
	claimAll := func(s *Store, tag string) (failed int) {
		for i := range 30 {
			key := testKeyPrefix + tag + strconv.Itoa(i)
			if res, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
				failed++
			}
		}
		return failed
	}
	one := []string{c.Nodes[0].Addr}
	if n := claimAll(provisionRedisStore(t, &Store{Address: one}), "standalone_"); n == 0 {
		t.Fatal("one Cluster node as a standalone server: no claim failed; the test does not show what cluster fixes")
	}
	for _, pipeline := range []bool{false, true} {
		s := provisionRedisStore(t, &Store{Address: one, Cluster: true, DisablePipeline: !pipeline})
		if s.cluster == nil {
			t.Fatal("cluster with one address: not a Cluster client")
		}
		if n := claimAll(s, "cluster_"+strconv.FormatBool(pipeline)+"_"); n != 0 {
			t.Fatalf("cluster with one address (pipeline %v): %d of 30 claims failed", pipeline, n)
		}
	}
}
