package redis

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// applyACL runs the README's line through a shell, as a user would paste
// it, against the Redis at addr.
func applyACL(t *testing.T, line, addr string) {
	t.Helper()
	if out := runREADMELine(t, line, addr); strings.TrimSpace(out) != "OK" {
		t.Fatalf("README ACL line on %s: %s", addr, out)
	}
}

// runREADMELine runs a README line through a shell, as a user would
// paste it, with every redis-cli in it pointed at the Redis at addr, and
// returns its output.
func runREADMELine(t *testing.T, line, addr string) string {
	t.Helper()
	redistest.Bin(t, "redis-cli")
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("sh", "-c", strings.ReplaceAll(line, "redis-cli ", "redis-cli -h "+host+" -p "+port+" ")).CombinedOutput()
	if err != nil {
		t.Fatalf("README line %q on %s: %v: %s", line, addr, err, out)
	}
	return string(out)
}

var exerciseCount int

// exerciseStore runs every store operation, with the scripts flushed
// once (go-redis then sends them with EVAL), and fails the test on any
// error or on any command Redis refused (ACL LOG).
func exerciseStore(t *testing.T, s *Store, admins []*goredis.Client) {
	exerciseCount++
	run := strconv.Itoa(exerciseCount)
	t.Helper()
	ctx := context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Unix(1733140801, 0), EventType: "x"}
	must := func(what string, ok bool, err error) {
		t.Helper()
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", what, ok, err)
		}
	}
	if s.cache != nil {
		waitFor(t, "the local cache's tracking connection", s.cache.Live)
	}
	for round := range 2 {
		if round == 1 {
			for _, a := range admins {
				if err := a.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, id := range []string{"evt_a", "evt_b", "evt_c", "evt_d"} {
			key := testKeyPrefix + id + "_" + run + strings.Repeat("x", round)
			res, _, err := s.Claim(ctx, key, "tok", time.Minute)
			must("claim "+key, res == dedup.Claimed, err)
			ok, err := s.Renew(ctx, key, "tok", time.Minute)
			must("renew "+key, ok, err)
			if id == "evt_a" || id == "evt_c" {
				ok, err = s.Commit(ctx, key, "tok", rec, time.Hour)
				must("commit "+key, ok, err)
				res, _, err = s.Claim(ctx, key, "tok2", time.Minute)
				must("claim after commit "+key, res == dedup.AlreadyDone, err)
				if s.cache != nil {
					waitFor(t, "the local cache learning "+key, func() bool { return s.cache.Has(key) })
					hits := s.cache.Hits()
					res, _, err = s.Claim(ctx, key, "tok2", time.Minute)
					must("claim answered from the local cache "+key, res == dedup.AlreadyDone && s.cache.Hits() == hits+1, err)
				}
				// the operators' look-up and forget (admin API)
				e, err := s.Get(ctx, key)
				must("get "+key, e.State() == "done", err)
				_, deleted, err := s.Forget(ctx, key, false)
				must("forget "+key, deleted, err)
			} else {
				ok, err = s.Release(ctx, key, "tok")
				must("release "+key, ok, err)
			}
		}
	}
	for _, a := range admins {
		all, err := a.Do(ctx, "ACL", "LOG").Slice()
		if err != nil {
			t.Fatal(err)
		}
		var entries []any
		for _, e := range all {
			// The optional eviction check, refused by the README's ACL.
			if m, _ := e.(map[any]any); m["object"] == "config|get" || m["object"] == "info" {
				continue
			}
			entries = append(entries, e)
		}
		if len(entries) != 0 {
			t.Fatalf("Redis refused commands of the store (ACL LOG on %s): %v", a.Options().Addr, entries)
		}
	}
}

// cacheOn is local_cache set (it is off by default).
var cacheOn = intPtr(10000)

// TestREADMEACLStandalone: the README's ACL line, run as printed, lets
// the store run every command it needs on a standalone Redis, with and
// without wait_replicas, the local cache included: it stays on past its
// heartbeats and answers duplicates with no Redis command.
func TestREADMEACLStandalone(t *testing.T) {
	line, user, password := redistest.DocsACL(t)
	srv := startRedis(t)
	applyACL(t, line, srv.Addr)
	admin := srv.Client(t)
	for _, wait := range []int{0, 1} {
		for _, noPipeline := range []bool{false, true} {
			s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: user, Password: password, LocalCache: cacheOn,
				WaitReplicas: wait, DisablePipeline: noPipeline, WaitTimeout: caddy.Duration(10 * time.Millisecond)})
			exerciseStore(t, s, []*goredis.Client{admin})
		}
	}
	duplicatesFromCache(t, provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: user, Password: password, LocalCache: cacheOn}), admin)
}

// TestREADMEACLWithDB: a db other than 0 makes every connection run
// SELECT, which the README's ACL line does not grant: the first claim
// names the missing permission, and granting +select, as the README
// says, is enough for every operation, the local cache included.
func TestREADMEACLWithDB(t *testing.T) {
	line, user, password := redistest.DocsACL(t)
	srv := startRedis(t)
	applyACL(t, line, srv.Addr)
	admin := srv.Client(t)
	ctx := context.Background()
	s := &Store{Address: []string{srv.Addr}, Username: user, Password: password, LocalCache: cacheOn, DB: 1}
	logs := observeStore(s)
	provisionRedisStore(t, s)
	s.check.retryEvery = 0
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_db", "tok", time.Minute); err == nil {
		t.Fatal("claim in db 1 without SELECT permission: no error")
	}
	if e := logs.FilterMessage(permLog).All(); len(e) != 1 || e[0].ContextMap()["command"] != "select" {
		t.Fatalf("logs %v; want one error naming select", logs.All())
	}
	waitFor(t, "the local cache's warning naming SELECT", func() bool {
		e := logs.FilterMessage("local_cache off").All()
		return len(e) == 1 && strings.Contains(e[0].ContextMap()["needs"].(string), "SELECT")
	})
	must(t, admin.Do(ctx, "ACL", "SETUSER", user, "+select").Err())
	must(t, admin.Do(ctx, "ACL", "LOG", "RESET").Err())
	s = provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: user, Password: password, LocalCache: cacheOn, DB: 1, PoolSize: 2})
	exerciseStore(t, s, []*goredis.Client{admin})
}

// duplicatesFromCache checks that s's local cache stays on past its
// tracking connection's heartbeats, and answers duplicates with no Redis
// command: of 5 duplicates, the first costs the claim's SET and the
// look-up's GET and PTTL, the other 4 nothing. (With the README's ACL
// lacking the heartbeat's permission, the cache came on for a second
// every 10 s, and every duplicate cost a SET.)
func duplicatesFromCache(t *testing.T, s *Store, admin *goredis.Client) {
	t.Helper()
	key := testKeyPrefix + "evt_cached_as_readme_user"
	processed(t, s, key)
	waitFor(t, "the local cache's tracking connection", s.cache.Live)
	beats := s.tracker.beats.Load()
	waitFor(t, "two heartbeats answered on the tracking connection", func() bool { return s.tracker.beats.Load() >= beats+2 })
	if !s.cache.Live() {
		t.Fatal("the local cache went off after its heartbeats")
	}
	cmds := []string{"set", "get", "pttl", "eval", "evalsha"}
	calls := func() map[string]int64 {
		m := map[string]int64{}
		for _, c := range cmds {
			m[c] = commandCalls(t, admin, c)
		}
		return m
	}
	before := calls()
	for i := range 5 {
		if res, _, err := s.Claim(context.Background(), key, "tok-dup", time.Minute); err != nil || res != dedup.AlreadyDone {
			t.Fatalf("duplicate %d: %v %v", i+1, res, err)
		}
		if i == 0 {
			waitFor(t, "the local cache learning "+key, func() bool { return s.cache.Has(key) })
		}
	}
	after := calls()
	want := map[string]int64{"set": 1, "get": 1, "pttl": 1}
	for _, c := range cmds {
		if d := after[c] - before[c]; d != want[c] {
			t.Errorf("5 duplicates cost %d %s, want %d (all: before %v, after %v)", d, strings.ToUpper(c), want[c], before, after)
		}
	}
	// The heartbeats keep the key tracked: its deletion still reaches
	// the cache.
	beats = s.tracker.beats.Load()
	waitFor(t, "two more heartbeats", func() bool { return s.tracker.beats.Load() >= beats+2 })
	if err := admin.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the invalidation of "+key+" after heartbeats", func() bool { return !s.cache.Has(key) })
	if res, _, err := s.Claim(context.Background(), key, "tok-new", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("delivery after DEL: %v %v, want claimed", res, err)
	}
}

// TestREADMEACLCluster: the same on a Redis Cluster, the line run on
// every node.
func TestREADMEACLCluster(t *testing.T) {
	line, user, password := redistest.DocsACL(t)
	c := redistest.StartCluster(t)
	var admins []*goredis.Client
	for _, n := range c.Nodes {
		applyACL(t, line, n.Addr)
		admins = append(admins, n.Client(t))
	}
	for _, wait := range []int{0, 1} {
		for _, noPipeline := range []bool{false, true} {
			s := provisionRedisStore(t, &Store{Address: c.Addrs(), Username: user, Password: password,
				WaitReplicas: wait, DisablePipeline: noPipeline, WaitTimeout: caddy.Duration(500 * time.Millisecond)})
			exerciseStore(t, s, admins)
		}
	}

	// A key in a slot being migrated: its old master answers ASK, and
	// the client sends ASKING then the command to the new one.
	s := provisionRedisStore(t, &Store{Address: c.Addrs(), Username: user, Password: password})
	migrating(t, admins, testKeyPrefix+"evt_ask")
	if res, _, err := s.Claim(context.Background(), testKeyPrefix+"evt_ask", "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim in a migrating slot: %v %v", res, err)
	}
	asked := false
	for _, a := range admins {
		asked = asked || infoLine(a.Info(context.Background(), "commandstats").Val(), "cmdstat_asking:") != ""
	}
	if !asked {
		t.Fatal("no ASKING was sent: the test did not go through a migrating slot")
	}
	exerciseStore(t, s, admins) // checks the ACL LOG again

	// Without CLUSTER SLOTS nothing works on a Cluster: the first claim
	// says so.
	var pw string
	for _, a := range admins {
		pw = redistest.ACLUser(t, a, "noslots", "", "+cluster|slots")
	}
	s = provisionRedisStore(t, &Store{Address: c.Addrs(), Username: "noslots", Password: pw})
	logs := observeStore(s)
	if _, _, err := s.Claim(context.Background(), testKeyPrefix+"evt_1", "tok", time.Minute); err == nil {
		t.Fatal("claim without CLUSTER SLOTS: no error")
	}
	if e := logs.FilterMessage(permLog).All(); len(e) != 1 || e[0].ContextMap()["command"] != "cluster|slots" {
		t.Fatalf("logs %v; want one error naming cluster|slots", logs.All())
	}
}

// migrating marks the slot of key (absent) as migrating from its master
// to another master, so that its master answers ASK for it.
func migrating(t *testing.T, admins []*goredis.Client, key string) {
	t.Helper()
	ctx := context.Background()
	slot := admins[0].ClusterKeySlot(ctx, key).Val()
	var from, to *goredis.Client
	var fromID, toID string
	for _, a := range admins {
		if !strings.Contains(a.Info(ctx, "replication").Val(), "role:master") {
			continue
		}
		id := a.ClusterMyID(ctx).Val()
		owns := false
		//lint:ignore SA1019 CLUSTER SLOTS still answers on Redis 7, and its slot ranges are what this needs
		for _, r := range a.ClusterSlots(ctx).Val() {
			if int64(r.Start) <= slot && slot <= int64(r.End) && r.Nodes[0].ID == id {
				owns = true
			}
		}
		if owns {
			from, fromID = a, id
		} else if to == nil {
			to, toID = a, id
		}
	}
	if from == nil || to == nil {
		t.Fatalf("slot %d: no owner or no other master", slot)
	}
	if err := to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID).Err(); err != nil {
		t.Fatal(err)
	}
}
