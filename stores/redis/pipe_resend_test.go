package redis

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/faultproxy"
)

// countingProxy starts a fault proxy in front of srvAddr that counts the
// claims (SET key inflight:...) of key it delivers to Redis.
func countingProxy(t *testing.T, srvAddr, key string) (*faultproxy.Proxy, *atomic.Int64) {
	t.Helper()
	px, err := faultproxy.Start(srvAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	var n atomic.Int64
	isClaim := setOf(dedup.InFlightPrefix)
	px.ResetAfter(1, func(c faultproxy.Command) bool { // never true: counts only
		if isClaim(c) && bytes.Equal(c[1], []byte(key)) {
			n.Add(1)
		}
		return false
	})
	return px, &n
}

// TestRedisPipeTimeoutNotResent: a command whose reply did not come
// within read_timeout fails; it is not sent again on a new connection
// (pipe.go, retriable: the request has waited read_timeout already, and
// a resend doubles what a delivery waits).
func TestRedisPipeTimeoutNotResent(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	key := testKeyPrefix + "evt_slow"
	px, sent := countingProxy(t, srv.Addr, key)
	s := provisionRedisStore(t, &Store{Address: []string{px.Addr()}, ReadTimeout: caddy.Duration(200 * time.Millisecond)})
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_warm", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	must(t, admin.Do(ctx, "CLIENT", "PAUSE", "1000", "WRITE").Err())
	if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err == nil {
		t.Fatal("claim while Redis is paused succeeded, want a timeout")
	}
	time.Sleep(500 * time.Millisecond) // a resend would have been delivered by now
	if n := sent.Load(); n != 1 {
		t.Fatalf("the claim that timed out was sent %d times, want once", n)
	}
}

// TestRedisPipeErrorReplyNotResent: a command Redis answered with an
// error is not sent again (Redis executed it and said no).
func TestRedisPipeErrorReplyNotResent(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	key := testKeyPrefix + "evt_list"
	px, sent := countingProxy(t, srv.Addr, key)
	s := provisionRedisStore(t, &Store{Address: []string{px.Addr()}})
	ctx := context.Background()
	must(t, admin.LPush(ctx, key, "x").Err())
	if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err == nil || !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		t.Fatalf("claim of a list key: %v, want WRONGTYPE", err)
	}
	if n := sent.Load(); n != 1 {
		t.Fatalf("the claim answered WRONGTYPE was sent %d times, want once", n)
	}
}

// TestRedisPipeLeavesARetiredMaster: the pipe's connection to a server
// that answered READONLY (it became a replica: a failover, or an
// operator's REPLICAOF behind a DNS name) is not used again: the next
// command dials, so that it reaches whatever the address names now.
func TestRedisPipeLeavesARetiredMaster(t *testing.T) {
	master := startRedis(t)
	srv := startRedis(t)
	admin := srv.Client(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_r0", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	conn := currentConn(s)
	host, port, _ := strings.Cut(master.Addr, ":")
	must(t, admin.Do(ctx, "REPLICAOF", host, port).Err())
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_r1", "tok", time.Minute); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("claim on a replica: %v, want READONLY", err)
	}
	must(t, admin.Do(ctx, "REPLICAOF", "NO", "ONE").Err())
	if res, _, err := s.Claim(ctx, testKeyPrefix+"evt_r2", "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim after the promotion: %v %v", res, err)
	}
	if currentConn(s) == conn {
		t.Fatal("the connection that answered READONLY is still in use")
	}
}
