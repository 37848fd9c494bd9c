package redis

// The Redis store's operations: claim, renew, commit, release.

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

var (
	//go:embed lua/claim.lua
	claimLua string
	//go:embed lua/renew.lua
	renewLua string
	//go:embed lua/release.lua
	releaseLua string

	claimScript   = goredis.NewScript(claimLua)
	renewScript   = goredis.NewScript(renewLua)
	releaseScript = goredis.NewScript(releaseLua)
)

// failed is called with every error but goredis.Nil. A permission error
// makes the next claim check the permissions again (and answer 503 until
// they are enough). On a Redis Cluster
// it asks for a fresh slot map: go-redis reloads it by itself on MOVED
// redirects and otherwise only once a minute, so after a master dies
// and its replica takes over, every command for the dead master's slots
// would fail for up to a minute (measured: 60 s) without this.
func (s *Store) failed(err error) error {
	if isNoPerm(err) {
		s.check.reset() // the ACL changed: the next claim checks it again
	}
	if s.cluster != nil {
		s.cluster.ReloadState(context.Background()) // lazy and deduplicated by go-redis
	}
	return err
}

// Claim implements Store with `SET key lease NX GET PX ttl+MarkFor`
// (see markTag), unless the local cache holds key's done record. A new
// event or a done one costs that one command; only when it finds a
// marked lease (another delivery in flight, or a mark) does the claim
// script decide, atomically on Redis's clock, whether it is live
// (InFlight) or a mark (Reclaimed, now ours). Until the Redis user is
// known to have every permission the store needs (permCheck), it checks
// them first and fails without claiming if one is missing.
func (s *Store) Claim(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	if s.users.Closed() {
		// A delivery that reached a config already cleaned up: its
		// commit could not land (see Users.Closed).
		return 0, "", fmt.Errorf("redis store: %w", storepool.ErrUnloaded)
	}
	if s.cache != nil {
		if val, ok := s.cache.Get(key); ok {
			return dedup.AlreadyDone, val, nil
		}
	}
	if !s.check.ok.Load() {
		if err := s.check.ensure(ctx, s, key); err != nil {
			return 0, "", s.failed(err)
		}
	}
	old, null, err := s.set(ctx, key, dedup.InFlightPrefix, token, markSuffix, withMark(ttl), true)
	if err != nil {
		return 0, "", s.failed(err)
	}
	if null {
		return dedup.Claimed, "", nil
	}
	if _, _, marked := splitMark(old); marked {
		return s.claimMarked(ctx, key, token, ttl)
	}
	res := dedup.Classify(old, token)
	if res == dedup.AlreadyDone && s.tracker != nil {
		s.tracker.learn(key)
	}
	if res != dedup.Claimed {
		return res, old, nil
	}
	return dedup.Claimed, "", nil
}

// claimMarked is the claim script (lua/claim.lua), for a key that holds
// a marked lease.
func (s *Store) claimMarked(ctx context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	lease := dedup.LeaseValue(token)
	ms := strconv.FormatInt(withMark(ttl).Milliseconds(), 10)
	var reply string
	var err error
	if s.pipe != nil {
		reply, err = s.pipe.evalsha(ctx, claimScript.Hash(), key, lease, lease+markSuffix, ms)
	}
	if s.pipe == nil || isNoScript(err) {
		// go-redis loads the script when Redis has not got it (NOSCRIPT)
		reply, err = claimScript.Run(ctx, s.cmd, []string{key}, lease, lease+markSuffix, ms).Text()
	}
	if err != nil {
		return 0, "", s.failed(err)
	}
	if reply == "" || reply[0] < '0' || reply[0] > '3' {
		return 0, "", fmt.Errorf("redis store: unexpected claim script reply %q", reply)
	}
	old := reply[1:]
	switch r := dedup.ClaimResult(reply[0] - '0'); r {
	case dedup.Claimed:
		return r, "", nil
	case dedup.AlreadyDone:
		if s.tracker != nil {
			s.tracker.learn(key)
		}
		return r, old, nil
	case dedup.InFlight, dedup.Reclaimed:
		return r, leaseOf(old), nil
	}
	return 0, "", fmt.Errorf("redis store: unexpected claim script reply %q", reply)
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// withMark is a lease's ttl plus the mark's time (saturating).
func withMark(ttl time.Duration) time.Duration {
	if ttl > math.MaxInt64-dedup.MarkFor {
		return math.MaxInt64
	}
	return ttl + dedup.MarkFor
}

// set runs `SET key <v1><v2><v3> PX ttl [NX] GET` on the pipe, the
// auto-pipeliner or the client, and returns the old value or null.
func (s *Store) set(ctx context.Context, key, v1, v2, v3 string, ttl time.Duration, nx bool) (string, bool, error) {
	if s.pipe != nil {
		return s.pipe.set(ctx, key, v1, v2, v3, ttl, nx)
	}
	args := goredis.SetArgs{TTL: ttl, Get: true}
	if nx {
		args.Mode = "NX"
	}
	old, err := s.cmd.SetArgs(ctx, key, v1+v2+v3, args).Result()
	if errors.Is(err, goredis.Nil) {
		return "", true, nil
	}
	return old, false, err
}

// Renew implements Store with a compare-and-extend script: a lease whose
// time ran out (a mark) is not renewed.
func (s *Store) Renew(ctx context.Context, key, token string, ttl time.Duration) (bool, error) {
	n, err := renewScript.Run(ctx, s.cmd, []string{key}, dedup.LeaseValue(token), ttl.Milliseconds()).Int()
	if err != nil {
		return false, s.failed(err)
	}
	return n == 1, nil
}

// Commit implements Store with `SET key record GET PX retention`: the
// old value tells whether our lease was still there. The record is the
// compact one (dedup.DoneRecord.EncodeCompact): Redis holds it in RAM
// for every event within retention. With WaitReplicas,
// `WAIT n timeout` follows on the same connection, to the master that
// owns the key.
func (s *Store) Commit(ctx context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	var old string
	var null bool
	var err error
	val := rec.EncodeCompact()
	if s.WaitReplicas > 0 {
		old, err = s.commitAndWait(ctx, key, val, retention)
		if errors.Is(err, goredis.Nil) {
			null, err = true, nil
		}
	} else {
		old, null, err = s.set(ctx, key, "", val, "", retention, false)
	}
	if err != nil {
		return false, s.failed(err)
	}
	if null {
		return false, nil
	}
	// A retried commit whose first attempt landed finds its own record.
	// Our own lease counts as held live or run out (nobody took it over).
	return dedup.IsLease(leaseOf(old), token) || old == val, nil
}

func (s *Store) commitAndWait(ctx context.Context, key, val string, retention time.Duration) (string, error) {
	var p goredis.Pipeliner
	if s.cluster != nil {
		master, err := s.cluster.MasterForKey(ctx, key)
		if err != nil {
			return "", err
		}
		p = master.Pipeline()
	} else {
		p = s.client.Pipeline()
	}
	timeout := s.effectiveWaitTimeout()
	set := p.SetArgs(ctx, key, val, goredis.SetArgs{TTL: retention, Get: true})
	wait := goredis.NewIntCmd(ctx, "wait", s.WaitReplicas, timeout.Milliseconds())
	_ = p.Process(ctx, wait)
	_, _ = p.Exec(ctx)
	old, err := set.Result()
	// goredis.Nil: the SET wrote the record over nothing (the lease was
	// gone); its replication counts all the same.
	if err != nil && !errors.Is(err, goredis.Nil) {
		return old, err
	}
	if n, werr := wait.Result(); werr != nil || n < int64(s.WaitReplicas) {
		metrics.unreplicated.Inc()
		s.logger.Warn("commit unreplicated",
			zap.String("key", key), zap.Int64("acknowledged", n), zap.Int("wanted", s.WaitReplicas), zap.Error(werr))
	}
	return old, err
}

// Release implements Store with a compare-and-delete script: it deletes
// the token's lease live or run out (a released lease leaves no mark).
// A key already absent counts as released: the client sends the script
// again when a reply is lost (MaxRetries, the pipeline), and that second
// run finds the key its first deleted. (Reported as lost, it was logged
// "lease lost" and counted, and alerted on.)
func (s *Store) Release(ctx context.Context, key, token string) (bool, error) {
	n, err := releaseScript.Run(ctx, s.cmd, []string{key}, dedup.LeaseValue(token)).Int()
	if err != nil {
		return false, s.failed(err)
	}
	return n == 1 || n == 2, nil
}
