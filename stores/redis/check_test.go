package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// observe replaces the store's logger with an observer.
func observeStore(s *Store) *observer.ObservedLogs {
	core, logs := observer.New(zapcore.DebugLevel)
	s.logger = zap.New(core)
	return logs
}

const permLog = "redis permission missing"

// TestRedisPermissionCheckNamesTheMissingCommand: with any one of the
// permissions of the README's ACL missing, the first claim fails before
// claiming anything, and the error log names the missing command. (On
// today's code without the check, a user without GET, PEXPIRE, DEL or
// WAIT claims fine, and renewals or releases then fail.)
func TestRedisPermissionCheckNamesTheMissingCommand(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	ctx := context.Background()
	for _, c := range []struct {
		drop, keys, want string
		wait             int
	}{
		{drop: "+set", want: "set"},
		{drop: "+get", want: "get"},
		{drop: "+pexpire", want: "pexpire"},
		{drop: "+pttl", want: "pttl"},
		{drop: "+del", want: "del"},
		{drop: "+eval", want: "eval"},
		{drop: "+evalsha", want: "evalsha"},
		{drop: "+wait", want: "wait", wait: 1},
		{keys: "~other:*", want: "set"},
	} {
		user := "u" + strings.Trim(c.drop, "+") + strings.Trim(c.keys, "~:*")
		pw := redistest.ACLUser(t, admin, user, c.keys, c.drop)
		s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: user, Password: pw, WaitReplicas: c.wait})
		logs := observeStore(s)
		key := testKeyPrefix + "evt_" + user
		res, _, err := s.Claim(ctx, key, "tok", time.Minute)
		var pe *permissionError
		if err == nil || !errors.As(err, &pe) {
			t.Errorf("without %s%s: claim = %v, %v; want a permission error", c.drop, c.keys, res, err)
			continue
		}
		if n := admin.Exists(ctx, key).Val(); n != 0 {
			t.Errorf("without %s%s: the event's key was claimed all the same", c.drop, c.keys)
		}
		entries := logs.FilterMessage(permLog).All()
		if len(entries) != 1 || entries[0].Level != zapcore.ErrorLevel || entries[0].ContextMap()["command"] != c.want {
			t.Errorf("without %s%s: logs %v; want one error naming %q", c.drop, c.keys, logs.All(), c.want)
			continue
		}
		if c.keys != "" && !strings.HasPrefix(entries[0].ContextMap()["key"].(string), key+":acl-check:") {
			t.Errorf("key refused: log %v does not name the key", entries[0].ContextMap())
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("the error holds the password: %v", err)
		}
	}
}

// TestRedisPermissionCheckRecovers: a refusal is remembered (no check
// per request), and once the permission is granted a later claim checks
// again and goes through, without a restart.
func TestRedisPermissionCheckRecovers(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	ctx := context.Background()
	pw := redistest.ACLUser(t, admin, "caddy", "", "+pexpire")
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: "caddy", Password: pw})
	logs := observeStore(s)
	s.check.retryEvery = time.Hour
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err == nil {
		t.Fatal("claim without PEXPIRE: no error")
	}
	sets := func() string { return infoLine(admin.Info(ctx, "commandstats").Val(), "cmdstat_set:") }
	before := sets()
	for range 5 {
		if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err == nil {
			t.Fatal("claim without PEXPIRE: no error")
		}
	}
	if after := sets(); after != before || logs.FilterMessage(permLog).Len() != 1 {
		t.Fatalf("a remembered refusal reached Redis again (%q then %q) or was logged again (%d)", before, after, logs.FilterMessage(permLog).Len())
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", "caddy", "+pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	s.check.mu.Lock()
	s.check.retryEvery = 0
	s.check.mu.Unlock()
	res, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute)
	if err != nil || res != dedup.Claimed {
		t.Fatalf("claim after PEXPIRE was granted: %v %v", res, err)
	}
	if ok, err := s.Renew(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); !ok || err != nil {
		t.Fatalf("renew: %v %v", ok, err)
	}
}

func infoLine(info, prefix string) string {
	for _, l := range strings.Split(info, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// TestRedisPermissionRevokedLater: a permission taken away while Caddy
// runs shows as a failed renewal; the next claim checks again and is
// refused with the command named, instead of claiming events whose
// leases can no longer be renewed.
func TestRedisPermissionRevokedLater(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	ctx := context.Background()
	pw := redistest.ACLUser(t, admin, "caddy", "")
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: "caddy", Password: pw})
	logs := observeStore(s)
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "caddy", "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Renew(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err == nil {
		t.Fatal("renew without PEXPIRE: no error")
	}
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_2", "tok", time.Minute); err == nil {
		t.Fatal("claim after PEXPIRE was revoked: no error")
	}
	if e := logs.FilterMessage(permLog).All(); len(e) != 1 || e[0].ContextMap()["command"] != "pexpire" {
		t.Fatalf("logs %v; want one error naming pexpire", logs.All())
	}
}

// TestRedisEvictionPolicyWarning: at the first claim the store warns
// when Redis may evict keys (any policy but noeviction), and says
// nothing when it may not, or when the user may not read the setting.
func TestRedisEvictionPolicyWarning(t *testing.T) {
	const warn = "redis may evict keys"
	ctx := context.Background()
	claim := func(s *Store) *observer.ObservedLogs {
		t.Helper()
		logs := observeStore(s)
		if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok"+s.Username, time.Minute); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_2", "tok"+s.Username, time.Minute); err != nil {
			t.Fatal(err)
		}
		return logs
	}
	for _, policy := range []string{"volatile-lru", "volatile-ttl", "allkeys-lru"} {
		srv := redistest.Start(t, "--maxmemory-policy", policy)
		logs := claim(provisionRedisStore(t, &Store{Address: []string{srv.Addr}}))
		e := logs.FilterMessage(warn).All()
		if len(e) != 1 || e[0].Level != zapcore.WarnLevel || e[0].ContextMap()["maxmemory_policy"] != policy {
			t.Errorf("%s: logs %v; want one warning naming the policy", policy, logs.All())
		}
		// The README's user may not run CONFIG GET: nothing but a debug line.
		pw := redistest.ACLUser(t, srv.Client(t), "caddy", "")
		logs = claim(provisionRedisStore(t, &Store{Address: []string{srv.Addr}, Username: "caddy", Password: pw}))
		if logs.FilterMessage(warn).Len() != 0 || logs.FilterMessage("eviction policy not checked").Len() != 1 {
			t.Errorf("%s, user without CONFIG GET: logs %v", policy, logs.All())
		}
	}
	srv := startRedis(t) // noeviction, Redis's default
	if logs := claim(provisionRedisStore(t, &Store{Address: []string{srv.Addr}})); logs.FilterLevelExact(zapcore.WarnLevel).Len() != 0 {
		t.Errorf("noeviction: warnings %v", logs.All())
	}
}

// TestRedisEvictedKeysWarning: a Redis that has evicted keys is reported
// at the first claim.
func TestRedisEvictedKeysWarning(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-random")
	admin := srv.Client(t)
	ctx := context.Background()
	big := strings.Repeat("x", 64<<10)
	for i := 0; i < 200 && infoField(admin.Info(ctx, "stats").Val(), "evicted_keys") <= 0; i++ {
		if err := admin.Set(ctx, "filler:"+string(rune('a'+i%26))+strings.Repeat("y", i), big, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if infoField(admin.Info(ctx, "stats").Val(), "evicted_keys") <= 0 {
		t.Fatal("could not make Redis evict a key")
	}
	// Make room again (evicted_keys stays): at its limit, allkeys-random
	// could evict the permission check's own key under it.
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	logs := observeStore(s)
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if logs.FilterMessage("redis has evicted keys").Len() != 1 {
		t.Fatalf("logs %v", logs.All())
	}
}
