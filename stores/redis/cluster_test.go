package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
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

// TestDataIDWithRedisDown: a Cluster or Sentinel store whose Redis
// cannot be asked which Cluster or master it is (down at Caddy's start)
// still provisions, soon, with the addresses as its state ID (sorted:
// the order makes no difference), so Caddy starts while Redis is down.
func TestDataIDWithRedisDown(t *testing.T) {
	a, b := "127.0.0.1:"+strconv.Itoa(netkit.FreePort(t)), "127.0.0.1:"+strconv.Itoa(netkit.FreePort(t)) // nothing listens there
	for name, pair := range map[string][2]*Store{
		"cluster":  {{Address: []string{a, b}}, {Address: []string{b, a}}},
		"sentinel": {{Address: []string{a, b}, MasterName: "m"}, {Address: []string{b, a}, MasterName: "m"}},
	} {
		core, logs := observer.New(zap.DebugLevel)
		pair[0].logger = zap.New(core)
		start := time.Now()
		x, y := provisionRedisStore(t, pair[0]), provisionRedisStore(t, pair[1])
		if d := time.Since(start); d > 2*identifyTimeout {
			t.Errorf("%s: provisioning with Redis down took %v", name, d)
		}
		if x.DataID() != y.DataID() || !strings.Contains(x.DataID(), "127.0.0.1") && !strings.Contains(x.DataID(), "localhost") {
			t.Errorf("%s: state IDs %q and %q", name, x.DataID(), y.DataID())
		}
		if w := logs.FilterMessage("redis identity unknown").All(); len(w) != 1 || w[0].ContextMap()["compared_as"] != x.DataID() {
			t.Errorf("%s: warnings %v", name, logs.All())
		}
	}
}
