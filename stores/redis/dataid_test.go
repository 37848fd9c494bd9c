package redis

import (
	"context"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestDataIDOfAClientOpenedWhileRedisWasDown: a Sentinel store
// provisioned while the Sentinels are down gets the addresses' ID, and
// so does another store of the same load on the client (two routes of
// one load do not differ, and the second does not wait again). A later
// load (a reload) on the same client, once they are up, asks again and
// gets the master's ID, so that it is compared like any client opened
// since (TestServerIdentityAskedAgainOnceSentinelsAnswer); the
// addresses' ID is then its alias, so that a forget through the later
// config stops the commit retries registered under it
// (TestForgetStopsCommitRetriesUnderAnAlias). A new client (other
// settings) asks too, and has no alias.
func TestDataIDOfAClientOpenedWhileRedisWasDown(t *testing.T) {
	st := redistest.StartSentinel(t)
	for _, s := range st.Sentinels {
		s.Kill()
	}
	core, logs := observer.New(zap.DebugLevel)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := provisionRedisStoreIn(t, ctx, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName, logger: zap.New(core)})
	if strings.Contains(a.DataID(), st.Master.Addr) {
		t.Fatalf("Sentinels down: state ID %q names the master", a.DataID())
	}
	if n := logs.FilterMessage("redis identity unknown").Len(); n != 1 {
		t.Fatalf("Sentinels down: %d \"redis identity unknown\" warnings, want 1: %v", n, logs.All())
	}

	for _, s := range st.Sentinels {
		s.Restart(t)
	}
	a2 := provisionRedisStoreIn(t, ctx, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName, logger: zap.New(core)})
	if a2.client != a.client || a2.DataID() != a.DataID() || logs.FilterMessage("redis identity unknown").Len() != 1 {
		t.Fatalf("a second store of the same load: state ID %q (first %q), same client %v, %d warnings", a2.DataID(), a.DataID(), a2.client == a.client, logs.FilterMessage("redis identity unknown").Len())
	}
	master := "localhost:" + st.Master.Addr[strings.LastIndex(st.Master.Addr, ":")+1:]
	b := provisionRedisStore(t, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName}) // another load
	if b.client != a.client {
		t.Fatal("the later load's store does not share the first one's client; the test shows nothing")
	}
	if !strings.Contains(b.DataID(), master) {
		t.Errorf("a later load on the client, the Sentinels up: state ID %q, want the master's (%s)", b.DataID(), st.Master.Addr)
	}
	if al := b.DataAliases(); len(al) != 1 || al[0] != a.DataID() {
		t.Errorf("aliases %q, want the addresses' ID %q", al, a.DataID())
	}

	c := provisionRedisStore(t, &Store{Address: st.SentinelAddrs(), MasterName: redistest.MasterName, PoolSize: 7})
	if c.client == a.client || !strings.Contains(c.DataID(), master) || len(c.DataAliases()) != 0 {
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
