package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestRedisSentinelFailoverCommitsReachTheNewMaster: after SENTINEL
// FAILOVER, once the Sentinels have announced the new master, claims and
// commits go to it. The old master stays a master for seconds more
// before Sentinel demotes it, and what it took meanwhile is discarded by
// its resync: a done record written there is lost, and the event's next
// delivery processed again. (Found by review: the store's own pipe and
// its tracking connection stayed on the old master until their
// connection broke, about 10 s; go-redis's failover client switches on
// the Sentinels' +switch-master. The store now uses that client behind
// Sentinel.)
func TestRedisSentinelFailoverCommitsReachTheNewMaster(t *testing.T) {
	for _, c := range []struct {
		name string
		s    Store
	}{
		{"default", Store{}},
		{"disable_pipeline", Store{DisablePipeline: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := redistest.StartSentinel(t)
			store := c.s
			store.Address, store.MasterName = st.SentinelAddrs(), redistest.MasterName
			s := provisionRedisStore(t, &store)
			processed(t, s, testKeyPrefix+"evt_before")
			if s.cache != nil {
				t.Error("the local cache is on behind Sentinel: its tracking connection would stay on the old master")
			}

			sc := goredis.NewSentinelClient(&goredis.Options{Addr: st.Sentinels[0].Addr})
			defer sc.Close()
			if err := sc.Failover(context.Background(), redistest.MasterName).Err(); err != nil {
				t.Fatal(err)
			}
			newMaster, old := st.Replica.Client(t), st.Master.Client(t)
			role := func(c *goredis.Client, want string) func() bool {
				return func() bool {
					info, _ := c.Info(context.Background(), "replication").Result()
					return strings.Contains(info, want)
				}
			}
			waitFor(t, "the replica promoted", role(newMaster, "role:master"))
			waitFor(t, "the Sentinels announcing it", func() bool {
				addr, err := sc.GetMasterAddrByName(context.Background(), redistest.MasterName).Result()
				return err == nil && len(addr) == 2 && strings.HasSuffix(st.Replica.Addr, ":"+addr[1])
			})
			time.Sleep(500 * time.Millisecond) // the announcement reaches the clients
			if !role(old, "role:master")() {
				t.Log("the old master was demoted already: this run does not test the window")
			}
			key := testKeyPrefix + "evt_after_failover"
			processed(t, s, key)
			waitFor(t, "the old master demoted and in sync", func() bool {
				return role(old, "role:slave")() && role(old, "master_link_status:up")()
			})
			if newMaster.Get(context.Background(), key).Val() == "" {
				t.Fatal("the done record committed after the failover is gone: its next delivery would be processed again")
			}
			ctx := context.Background()
			if res, _, err := s.Claim(ctx, key, "tok-redelivery", time.Minute); err != nil || res != dedup.AlreadyDone {
				t.Fatalf("redelivery after the failover: %v %v, want done", res, err)
			}
		})
	}
}
