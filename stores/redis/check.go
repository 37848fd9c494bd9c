package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/firstcheck"
)

// checkRetryEvery is how long a failed permission check is remembered
// before a request runs it again.
const checkRetryEvery = time.Second

// permCheck runs the store's first-use check of the Redis user's
// permissions (checkPermissions) until it passes, one at a time, and
// remembers a refusal for retryEvery so that a broken ACL costs Redis one
// check a second, not one per request (firstcheck).
type permCheck struct {
	ok     atomic.Bool // the permissions are known to be enough
	flight firstcheck.Flight

	mu         sync.Mutex
	retryEvery time.Duration
	evChecks   atomic.Bool // the eviction policy was looked at
}

func newPermCheck() *permCheck { return &permCheck{retryEvery: checkRetryEvery} }

// ensure returns nil once the permissions are known to be enough, and
// otherwise the error that keeps the store from answering.
func (c *permCheck) ensure(ctx context.Context, s *Store, key string) error {
	c.mu.Lock()
	retryEvery := c.retryEvery
	c.mu.Unlock()
	return c.flight.Ensure(ctx, &c.ok, retryEvery, func(ctx context.Context) (bool, error) {
		err := s.checkPermissions(ctx, key)
		var pe *permissionError
		switch {
		case err == nil:
			if !c.evChecks.Swap(true) {
				s.checkEviction(ctx)
			}
		case errors.As(err, &pe):
			fields := []zap.Field{zap.String("command", pe.command), zap.Error(pe.err)}
			if pe.keys {
				fields = append(fields, zap.String("key", pe.key))
			}
			fields = append(fields, zap.Int("status", 503), zap.String("fix", "grant it: the ACL in the README"))
			s.logger.Error("redis permission missing", fields...)
			metrics.redisProblems.WithLabelValues(redisPermissionMissing).Inc()
		}
		return pe != nil, err
	})
}

// reset makes the next claim check the permissions again: called when
// Redis refuses a command for lack of permission (the ACL changed).
func (c *permCheck) reset() { c.ok.Store(false) }

// permissionError is Redis refusing a command the store needs.
type permissionError struct {
	command string // the command refused, as Redis names it (e.g. "pexpire", "cluster|slots")
	keys    bool   // the command is allowed, the key is not
	key     string
	err     error
}

func (e *permissionError) Error() string {
	if e.keys {
		return fmt.Sprintf("redis store: the Redis user may not use the key %s with %s (its key pattern must cover key_prefix): %v", e.key, e.command, e.err)
	}
	return fmt.Sprintf("redis store: the Redis user may not run %s: %v", e.command, e.err)
}

func (e *permissionError) Unwrap() error { return e.err }

// isNoPerm reports whether err is Redis refusing a command or a key to
// this user: NOPERM for a command sent directly, an ERR that says so for
// a command called by a script (Redis 7.0: "The user executing the script
// can't run this command"; 7.2: "ACL failure in script: this user has no
// permissions ...").
func isNoPerm(err error) bool {
	var re goredis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	msg := err.Error()
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "can't run this command") ||
		strings.Contains(strings.ToLower(msg), "no permissions to")
}

var deniedCommandRE = regexp.MustCompile(`'([A-Za-z0-9_|.-]+)' command`)

// checkPermissions runs, once, every command the store sends, on a key
// of its own next to key (so that it falls under the same ACL key
// pattern; ':' cannot appear in an event ID, so it is never an event's
// key): the claim's SET, GET, PEXPIRE, PTTL and, through the release script,
// DEL, both scripts with EVAL and EVALSHA, and WAIT 0 0 when
// WaitReplicas is set. A refusal is a *permissionError; any other error
// (Redis down) is returned as it is.
func (s *Store) checkPermissions(ctx context.Context, key string) error {
	ck := key + ":acl-check:" + checkToken()
	lease := dedup.LeaseValue(checkToken())
	ttl := 10 * time.Second // the key expires even if a step fails
	step := func(command string, err error) error {
		if err == nil || errors.Is(err, goredis.Nil) {
			return nil
		}
		if !isNoPerm(err) {
			return err
		}
		pe := &permissionError{command: command, key: ck, err: err}
		msg := err.Error()
		if m := deniedCommandRE.FindStringSubmatch(msg); m != nil {
			pe.command = strings.ToLower(m[1])
		} else if strings.Contains(strings.ToLower(msg), "key") {
			pe.keys = true
		}
		return pe
	}
	one := func(command string, n int64, err error) error {
		if err = step(command, err); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("redis store: permission check: %s returned %d, want 1", command, n)
		}
		return nil
	}
	if err := step("set", s.client.SetArgs(ctx, ck, lease, goredis.SetArgs{Mode: "NX", TTL: ttl, Get: true}).Err()); err != nil {
		return err
	}
	if err := step("get", s.client.Get(ctx, ck).Err()); err != nil {
		return err
	}
	if err := step("pexpire", s.client.PExpire(ctx, ck, ttl).Err()); err != nil {
		return err
	}
	// PTTL tells a live lease from a mark (lua/claim.lua, lua/renew.lua).
	if err := step("pttl", s.client.PTTL(ctx, ck).Err()); err != nil {
		return err
	}
	n, err := renewScript.Eval(ctx, s.client, []string{ck}, lease, ttl.Milliseconds()).Int64()
	if err := one("eval", n, err); err != nil {
		return err
	}
	n, err = renewScript.EvalSha(ctx, s.client, []string{ck}, lease, ttl.Milliseconds()).Int64()
	if err := one("evalsha", n, err); err != nil {
		return err
	}
	// GET and PEXPIRE passed on their own: a refusal inside the
	// release script is its DEL.
	n, err = releaseScript.Run(ctx, s.client, []string{ck}, lease).Int64()
	if err := one("del", n, err); err != nil {
		return err
	}
	if s.WaitReplicas > 0 {
		var c interface {
			Do(ctx context.Context, args ...any) *goredis.Cmd
		} = s.client
		if s.cluster != nil {
			m, err := s.cluster.MasterForKey(ctx, ck)
			if err != nil {
				return step("wait", err)
			}
			c = m
		}
		if err := step("wait", c.Do(ctx, "wait", 0, 0).Err()); err != nil {
			return err
		}
	}
	return nil
}

// checkEviction warns when a Redis node may evict keys: every key of the
// store has a time to live, so any policy but noeviction (volatile-* as
// much as allkeys-*) can evict done records, and a redelivery of an
// evicted event is processed again. It also warns when the node has
// evicted keys since it started. Where the user may not run CONFIG GET
// or INFO, it says so at debug level and checks nothing.
func (s *Store) checkEviction(ctx context.Context) {
	check := func(ctx context.Context, c *goredis.Client) error {
		node := c.Options().Addr
		vals, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		switch {
		case err != nil:
			if ce := s.logger.Check(zapcore.DebugLevel, "eviction policy not checked"); ce != nil {
				ce.Write(zap.String("node", node), zap.Error(err))
			}
		case vals["maxmemory-policy"] != "noeviction":
			s.logger.Warn("redis may evict keys",
				zap.String("node", node), zap.String("maxmemory_policy", vals["maxmemory-policy"]),
				zap.String("risk", "an evicted done record lets a redelivery be processed again"),
				zap.String("fix", "maxmemory-policy noeviction"))
			metrics.redisProblems.WithLabelValues(redisMayEvict).Inc()
		}
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			if ce := s.logger.Check(zapcore.DebugLevel, "evicted keys not checked"); ce != nil {
				ce.Write(zap.String("node", node), zap.Error(err))
			}
			return nil
		}
		if n := infoField(info, "evicted_keys"); n > 0 {
			s.logger.Warn("redis has evicted keys",
				zap.String("node", node), zap.Int64("evicted_keys", n),
				zap.String("risk", "a redelivery of an evicted done record was processed again"))
			metrics.redisProblems.WithLabelValues(redisEvictedKeys).Inc()
		}
		return nil
	}
	if s.cluster != nil {
		_ = s.cluster.ForEachMaster(ctx, check)
		return
	}
	if c, ok := s.client.(*goredis.Client); ok {
		_ = check(ctx, c)
	}
}

// infoField returns the integer field name of an INFO reply, or -1.
func infoField(info, name string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return -1
}

// checkToken is a random name for the permission check's own key.
func checkToken() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
