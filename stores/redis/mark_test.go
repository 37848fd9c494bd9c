package redis

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup/dedupstoretest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestRedisMarkOnTheWire: a lease is stored as "inflight:<token>;mark=<ms>"
// for its ttl plus dedup.MarkFor, readable with redis-cli; once its time
// ran out the key is still there (the mark) for about MarkFor.
func TestRedisMarkOnTheWire(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	c := srv.Client(t)
	ctx := context.Background()
	key := testKeyPrefix + "evt_wire"
	if res, _, err := s.Claim(ctx, key, "tok1", 200*time.Millisecond); err != nil || res != dedup.Claimed {
		t.Fatalf("claim = %v, %v", res, err)
	}
	if v, want := c.Get(ctx, key).Val(), "inflight:tok1;mark=604800000"; v != want {
		t.Fatalf("value = %q, want %q", v, want)
	}
	if d := c.PTTL(ctx, key).Val(); d > dedup.MarkFor+200*time.Millisecond || d < dedup.MarkFor {
		t.Fatalf("pttl = %v, want the lease's 200ms plus %v", d, dedup.MarkFor)
	}
	time.Sleep(300 * time.Millisecond)
	if d := c.PTTL(ctx, key).Val(); d < dedup.MarkFor-time.Second {
		t.Fatalf("pttl of the mark = %v, want about %v", d, dedup.MarkFor)
	}
	res, found, err := s.Claim(ctx, key, "tok2", time.Minute)
	if err != nil || res != dedup.Reclaimed || found != "inflight:tok1" {
		t.Fatalf("claim over the mark = %v, %q, %v; want reclaimed, the old lease", res, found, err)
	}
}

// TestRedisReleaseOfOwnMark: the owner's release of its own lease whose
// time ran out (its renewals failed, then the backend answered non-2xx)
// deletes the mark: the event's fate is known, the next delivery is
// not marked.
func TestRedisReleaseOfOwnMark(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	ctx := context.Background()
	key := testKeyPrefix + "evt_release"
	if _, _, err := s.Claim(ctx, key, "tok1", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if ok, err := s.Release(ctx, key, "tok1"); err != nil || !ok {
		t.Fatalf("release of the own mark = %v, %v; want true", ok, err)
	}
	if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim after the release = %v, %v; want claimed", res, err)
	}
}

// TestRedisLeasesOfThePreviousRelease: a lease written by the previous
// release ("inflight:<token>", TTL lock_ttl, no mark) blocks other
// claims until it expires, leaves no mark, and its owner (an old Caddy
// in a rolling upgrade, through these scripts) still renews, commits
// and releases it. Its done records are read as before.
func TestRedisLeasesOfThePreviousRelease(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	c := srv.Client(t)
	ctx := context.Background()
	old := func(key string, ttl time.Duration) {
		t.Helper()
		if err := c.Set(ctx, key, "inflight:old", ttl).Err(); err != nil {
			t.Fatal(err)
		}
	}
	key := testKeyPrefix + "evt_old"
	old(key, 300*time.Millisecond)
	res, found, err := s.Claim(ctx, key, "tok2", time.Minute)
	if err != nil || res != dedup.InFlight || found != "inflight:old" {
		t.Fatalf("claim over an old live lease = %v, %q, %v; want in flight", res, found, err)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State() != "in_flight" || e.Value != "inflight:old" {
		t.Fatalf("get of an old lease = %+v, %v", e, err)
	}
	if ok, err := s.Renew(ctx, key, "old", 400*time.Millisecond); err != nil || !ok {
		t.Fatalf("renew of an old lease by its owner = %v, %v", ok, err)
	}
	time.Sleep(200 * time.Millisecond)
	if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.InFlight {
		t.Fatalf("claim over a renewed old lease = %v, %v; want in flight", res, err)
	}
	time.Sleep(300 * time.Millisecond)
	if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim after the old lease expired = %v, %v; want claimed (it leaves no mark)", res, err)
	}

	key = testKeyPrefix + "evt_old_release"
	old(key, time.Minute)
	if ok, err := s.Release(ctx, key, "old"); err != nil || !ok {
		t.Fatalf("release of an old lease by its owner = %v, %v", ok, err)
	}
	key = testKeyPrefix + "evt_old_commit"
	old(key, time.Minute)
	rec := dedup.DoneRecord{ProcessedAt: testNow, EventType: "x"}
	if held, err := s.Commit(ctx, key, "old", rec, time.Hour); err != nil || !held {
		t.Fatalf("commit of an old lease by its owner = %v, %v", held, err)
	}
	if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.AlreadyDone {
		t.Fatalf("claim after the commit = %v, %v; want done", res, err)
	}
}

// prefixed runs the contract on one shared server with a key prefix of
// its own per harness (the suite's keys are fixed).
type prefixed struct {
	dedup.Store
	p string
}

func (s prefixed) Claim(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	return s.Store.Claim(ctx, s.p+key, token, ttl)
}
func (s prefixed) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	return s.Store.Renew(ctx, s.p+key, token, ttl)
}
func (s prefixed) Commit(ctx context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	return s.Store.Commit(ctx, s.p+key, token, rec, retention)
}
func (s prefixed) Release(ctx context.Context, key, token string) (bool, error) {
	return s.Store.Release(ctx, s.p+key, token)
}
func (s prefixed) Get(ctx context.Context, key string) (dedup.Entry, error) {
	return s.Store.Get(ctx, s.p+key)
}
func (s prefixed) Forget(ctx context.Context, key string, force bool) (dedup.Entry, bool, error) {
	return s.Store.Forget(ctx, s.p+key, force)
}

// TestStoreContractCluster: the contract, marks included, on a
// Redis Cluster (the keys of one run spread over the masters' slots).
func TestStoreContractCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { cc.Close() })
	s := provisionRedisStore(t, &Store{Address: cl.Addrs(), Cluster: true})
	var n atomic.Int64
	dedupstoretest.Run(t, func(t *testing.T) dedupstoretest.Harness {
		p := testKeyPrefix + "contract" + strconv.FormatInt(n.Add(1), 10) + "_"
		ctx := context.Background()
		return dedupstoretest.Harness{
			Store:  prefixed{s, p},
			Elapse: time.Sleep,
			Value:  func(key string) string { return leaseOf(cc.Get(ctx, p+key).Val()) },
			TTL: func(key string) time.Duration {
				ttl := cc.PTTL(ctx, p+key).Val()
				if _, mark, ok := splitMark(cc.Get(ctx, p+key).Val()); ok {
					return ttl - mark
				}
				return ttl
			},
			Short: 150 * time.Millisecond,
			Marks: true,
		}
	})
}

// TestRedisRetriedReclaimStaysReclaimed: a claim resent after its reply
// was lost (the pipe resends once on a broken connection, go-redis
// retries) finds its own lease; if the first attempt had reclaimed a
// mark, the resent one must say Reclaimed again, or the delivery would
// reach the backend unmarked.
func TestRedisRetriedReclaimStaysReclaimed(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	c := srv.Client(t)
	ctx := context.Background()
	key := testKeyPrefix + "evt_retried"
	if _, _, err := s.Claim(ctx, key, "tok1", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.Reclaimed {
		t.Fatalf("claim over the mark = %v, %v; want reclaimed", res, err)
	}
	if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.Reclaimed {
		t.Fatalf("the same claim resent = %v, %v; want reclaimed again", res, err)
	}
	if v := c.Get(ctx, key).Val(); v != "inflight:tok2;mark=604800000;reclaimed" {
		t.Fatalf("value = %q", v)
	}
	if e, err := s.Get(ctx, key); err != nil || e.State() != "in_flight" || e.Value != "inflight:tok2" {
		t.Fatalf("get = %+v, %v", e, err)
	}
	if ok, err := s.Renew(ctx, key, "tok2", time.Minute); err != nil || !ok {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	if ok, err := s.Release(ctx, key, "tok2"); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
}

// TestRedisClaimScriptAfterScriptFlush: the claim script runs on the
// pipe with EVALSHA; after a Redis restart or SCRIPT FLUSH (NOSCRIPT)
// it is loaded again, with and without the pipe.
func TestRedisClaimScriptAfterScriptFlush(t *testing.T) {
	srv := startRedis(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, noPipe := range []bool{false, true} {
		s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, DisablePipeline: noPipe})
		key := testKeyPrefix + "evt_flush_" + strconv.FormatBool(noPipe)
		if _, _, err := s.Claim(ctx, key, "tok1", 100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if res, _, err := s.Claim(ctx, key, "tok2", time.Minute); err != nil || res != dedup.Reclaimed {
			t.Fatalf("claim over a mark after SCRIPT FLUSH (pipe off: %v) = %v, %v; want reclaimed", noPipe, res, err)
		}
	}
}

// TestRedisClaimScriptFindsADoneRecord: the claim script runs after the
// plain claim found a marked lease; a commit may land in between. The
// script must then answer done with the record (not in flight), and
// change nothing.
func TestRedisClaimScriptFindsADoneRecord(t *testing.T) {
	srv := startRedis(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, noPipe := range []bool{false, true} {
		s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, DisablePipeline: noPipe})
		key := testKeyPrefix + "evt_turned_done_" + strconv.FormatBool(noPipe)
		rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "t", Fingerprint: "x0123456789abcdef"}.EncodeCompact()
		must(t, c.Set(ctx, key, rec, time.Hour).Err())
		res, found, err := s.claimMarked(ctx, key, "tok2", time.Minute)
		if err != nil || res != dedup.AlreadyDone || found != rec {
			t.Fatalf("pipeline off %v: claim script over a done record = %v, %q, %v; want done, the record", noPipe, res, found, err)
		}
		if v := c.Get(ctx, key).Val(); v != rec {
			t.Fatalf("pipeline off %v: the claim script changed the done record to %q", noPipe, v)
		}
	}
}
