package redis

import (
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestDataIDKeptForTheClient: a Sentinel store provisioned while the
// Sentinels are down gets the addresses' ID; another config on the same
// client (a reload, or a second route with the same settings)
// provisioned once they are up gets the same ID, not the master's: one
// client, one ID, so commit retries registered under it are stopped by
// a forget through either config, and two routes of one load do not
// differ. (Found by review: the fallback was not kept and the next
// provision asked again, so a reload changed the ID of a client whose
// retries were registered under the old one; the forget through the
// new config missed them.) A new client (other settings) asks again.
func TestDataIDKeptForTheClient(t *testing.T) {
	st := redistest.StartSentinel(t)
	for _, s := range st.Sentinels {
		s.Kill()
	}
	core, logs := observer.New(zap.DebugLevel)
	a := provisionRedisStore(t, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName, logger: zap.New(core)})
	if strings.Contains(a.DataID(), st.Master.Addr) {
		t.Fatalf("Sentinels down: state ID %q names the master", a.DataID())
	}
	if n := logs.FilterMessage("redis identity unknown").Len(); n != 1 {
		t.Fatalf("Sentinels down: %d \"redis identity unknown\" warnings, want 1: %v", n, logs.All())
	}

	for _, s := range st.Sentinels {
		s.Restart(t)
	}
	b := provisionRedisStore(t, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName})
	if b.client != a.client {
		t.Fatal("the second provision does not share the first one's client; the test shows nothing")
	}
	if b.DataID() != a.DataID() {
		t.Errorf("one client, two state IDs: %q while the Sentinels were down, %q once they were up", a.DataID(), b.DataID())
	}

	c := provisionRedisStore(t, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName, PoolSize: 7})
	if c.client == a.client || !strings.Contains(c.DataID(), "localhost:"+st.Master.Addr[strings.LastIndex(st.Master.Addr, ":")+1:]) {
		t.Errorf("a new client with the Sentinels up: state ID %q, want the master's (%s)", c.DataID(), st.Master.Addr)
	}
}

// Two seeds of one Cluster that list different replicas (one has not
// yet learned of a replica by gossip) name it alike: by its masters.
// With every node's ID counted, the replica "0000…" known to one seed
// only made one Cluster two stores.
func TestClusterIDIgnoresReplicas(t *testing.T) {
	node := func(id string) goredis.ClusterNode { return goredis.ClusterNode{ID: id, Addr: "127.0.0.1:1"} }
	a := []goredis.ClusterSlot{
		{Start: 0, End: 8191, Nodes: []goredis.ClusterNode{node("bbbb"), node("0000")}},
		{Start: 8192, End: 16383, Nodes: []goredis.ClusterNode{node("cccc"), node("dddd")}},
	}
	b := []goredis.ClusterSlot{
		{Start: 8192, End: 16383, Nodes: []goredis.ClusterNode{node("cccc")}},
		{Start: 0, End: 8191, Nodes: []goredis.ClusterNode{node("bbbb")}},
	}
	idA, errA := clusterID(a)
	idB, errB := clusterID(b)
	if errA != nil || errB != nil || idA != idB || idA != "redis cluster node bbbb" {
		t.Fatalf("one Cluster seen by two seeds: %q, %v and %q, %v; want both \"redis cluster node bbbb\"", idA, errA, idB, errB)
	}
	if _, err := clusterID([]goredis.ClusterSlot{{Start: 0, End: 16383}}); err == nil {
		t.Fatal("no master listed: no error")
	}
}
