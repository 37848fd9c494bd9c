package redis

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup/dedupstoretest"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// startRedis starts a real redis-server on a free loopback port for one
// test (stopped at cleanup), or fails the test if there is none.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

func provisionRedisStore(t testing.TB, s *Store) *Store {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return provisionRedisStoreIn(t, ctx, s)
}

// provisionRedisStoreIn is provisionRedisStore in the config load ctx
// (stores of one load share its context).
func provisionRedisStoreIn(t testing.TB, ctx caddy.Context, s *Store) *Store {
	t.Helper()
	if err := s.Provision(ctx); err != nil {
		t.Fatalf("provisioning redis store: %v", err)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("validating redis store: %v", err)
	}
	t.Cleanup(func() { s.Cleanup() })
	return s
}

func redisHarness(t *testing.T) dedupstoretest.Harness { return redisHarnessWith(t, false) }

func redisHarnessWith(t *testing.T, noPipeline bool) dedupstoretest.Harness {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, DisablePipeline: noPipeline})
	c := srv.Client(t)
	// A lease's value and time as the contract sees them: the mark's
	// own time (see markSuffix) left out.
	return dedupstoretest.Harness{
		Store:  s,
		Elapse: time.Sleep,
		Value: func(key string) string {
			v := c.Get(context.Background(), key).Val()
			if lease, _, ok := splitMark(v); ok {
				return lease
			}
			return v
		},
		TTL: func(key string) time.Duration {
			ttl := c.PTTL(context.Background(), key).Val()
			if _, mark, ok := splitMark(c.Get(context.Background(), key).Val()); ok {
				return ttl - mark
			}
			return ttl
		},
		Short: 150 * time.Millisecond,
		Marks: true,
	}
}
func TestStoreContract(t *testing.T) { dedupstoretest.Run(t, redisHarness) }

// The same contract with pipelining off (disable_pipeline).
func TestStoreContractNoPipeline(t *testing.T) {
	dedupstoretest.Run(t, func(t *testing.T) dedupstoretest.Harness { return redisHarnessWith(t, true) })
}

func TestRedisStoreErrorIsNotDuplicate(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{Address: []string{srv.Addr}, DialTimeout: caddy.Duration(200 * time.Millisecond)})
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, "k", "tok1", time.Minute); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	res, _, err := s.Claim(ctx, "k", "tok2", time.Minute)
	if err == nil {
		t.Fatalf("claim with Redis down = %v, nil error; want an error", res)
	}
	if _, err := s.Commit(ctx, "k", "tok1", dedup.DoneRecord{}, time.Minute); err == nil {
		t.Fatal("commit with Redis down: want an error")
	}
	if _, err := s.Release(ctx, "k", "tok1"); err == nil {
		t.Fatal("release with Redis down: want an error")
	}
	if _, err := s.Renew(ctx, "k", "tok1", time.Minute); err == nil {
		t.Fatal("renew with Redis down: want an error")
	}
	// Back again on the same port: the same client works, scripts are
	// reloaded (NOSCRIPT after a restart is handled).
	srv.Restart(t)
	if res, _, err := s.Claim(ctx, "k2", "tok1", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim after restart = %v, %v", res, err)
	}
	if ok, err := s.Release(ctx, "k2", "tok1"); err != nil || !ok {
		t.Fatalf("release after restart = %v, %v", ok, err)
	}
}

// TestRedisWaitReplicas: with wait_replicas the done record is on the
// replica when Commit returns; when fewer replicas acknowledge it, the
// record stays on the master and the shortfall is counted.
func TestRedisWaitReplicas(t *testing.T) {
	master := startRedis(t)
	replica := redistest.StartReplica(t, master)
	rc := replica.Client(t)
	ctx := context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Unix(1733140801, 0), EventType: "x"}

	s := provisionRedisStore(t, &Store{Address: []string{master.Addr}, WaitReplicas: 1, WaitTimeout: caddy.Duration(2 * time.Second)})
	before := testutil.ToFloat64(metrics.unreplicated)
	for i := range 20 {
		key := "wait:" + strconv.Itoa(i)
		if _, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil {
			t.Fatal(err)
		}
		if held, err := s.Commit(ctx, key, "tok", rec, time.Hour); err != nil || !held {
			t.Fatalf("commit: %v %v", held, err)
		}
		if v := rc.Get(ctx, key).Val(); !strings.HasPrefix(v, dedup.DonePrefix) {
			t.Fatalf("right after a WAIT 1 commit the replica holds %q", v)
		}
	}
	if d := testutil.ToFloat64(metrics.unreplicated) - before; d != 0 {
		t.Fatalf("unreplicated moved by %v with the replica up", d)
	}

	s2 := provisionRedisStore(t, &Store{Address: []string{master.Addr}, WaitReplicas: 2, WaitTimeout: caddy.Duration(50 * time.Millisecond)})
	if _, _, err := s2.Claim(ctx, "wait:short", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if held, err := s2.Commit(ctx, "wait:short", "tok", rec, time.Hour); err != nil || !held {
		t.Fatalf("commit with too few replicas: %v %v (the record must still be written)", held, err)
	}
	if d := testutil.ToFloat64(metrics.unreplicated) - before; d != 1 {
		t.Fatalf("unreplicated moved by %v, want 1", d)
	}
	if res, _, _ := s2.Claim(ctx, "wait:short", "tok2", time.Minute); res != dedup.AlreadyDone {
		t.Fatalf("claim after the commit: %v", res)
	}
	// A commit whose lease is gone (released, swept, forgotten) writes the
	// record all the same, and its replication is checked the same way.
	// (Found by review: the WAIT was not read when the SET found nothing.)
	if held, err := s2.Commit(ctx, "wait:no_lease", "tok", rec, time.Hour); err != nil || held {
		t.Fatalf("commit without a lease: %v %v", held, err)
	}
	if d := testutil.ToFloat64(metrics.unreplicated) - before; d != 2 {
		t.Fatalf("unreplicated moved by %v after a commit without a lease, want 2", d)
	}
}

func TestRedisStoreValidate(t *testing.T) {
	for name, c := range map[string]struct {
		s  Store
		ok bool
	}{
		"defaults":                         {Store{}, true},
		"wait under the read timeout":      {Store{WaitReplicas: 1, WaitTimeout: caddy.Duration(time.Second)}, true},
		"wait past the default read":       {Store{WaitReplicas: 1, WaitTimeout: caddy.Duration(5 * time.Second)}, false},
		"wait under a longer read timeout": {Store{WaitReplicas: 1, WaitTimeout: caddy.Duration(5 * time.Second), ReadTimeout: caddy.Duration(10 * time.Second)}, true},
		"negative db":                      {Store{DB: -1}, false},
		"negative wait_replicas":           {Store{WaitReplicas: -1}, false},
		"negative timeout":                 {Store{DialTimeout: -1}, false},
		// The default wait_timeout (100ms) is checked as a written one:
		// a read_timeout under it timed every commit out (found by review).
		"default wait past a short read": {Store{WaitReplicas: 1, ReadTimeout: caddy.Duration(50 * time.Millisecond)}, false},
		"short read, no wait":            {Store{ReadTimeout: caddy.Duration(50 * time.Millisecond)}, true},
		// go-redis allocates per pool_size: 10^8 took the process down
		// with an out-of-memory crash, on a reload too (found by review).
		"pool_size too large": {Store{PoolSize: 100_000_000}, false},
		"pool_size at most":   {Store{PoolSize: 10_000}, true},
	} {
		if err := c.s.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", name, err, c.ok)
		}
	}
}

func TestRedisStoreProvisionErrorsHideThePassword(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, s := range []*Store{
		{URL: "redis://user:hunter2secret@host:6379/x"},
		{URL: "redis://user:hunter2secret@ho st:6379"},
		{URL: "http://user:hunter2secret@host"},
		{URL: "redis://user:hunter2secret@host", Address: []string{"a:1"}},
	} {
		err := s.Provision(ctx)
		if err == nil {
			t.Errorf("%q provisioned", s.URL)
			continue
		}
		if strings.Contains(err.Error(), "hunter2secret") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// testKeyPrefix is the key prefix of the tests' events (the handler's
// default one).
const testKeyPrefix = "sangho_dedup:"

// testNow is the tests' fixed clock reading.
var testNow = time.Unix(1733140800, 0)

var tokens atomic.Uint64

// newToken is a lease token unique in this test process.
func newToken() string { return "tok-" + strconv.FormatUint(tokens.Add(1), 36) }

// Caddy calls Validate after Provision, which builds the client:
// Provision checks the values first, so that a JSON config's bad value
// is an error naming it, not a panic in go-redis (pool_size -1 made a
// channel of size -1).
func TestRedisStoreProvisionRefusesBadValuesFirst(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, c := range []struct {
		s    Store
		want string
	}{
		{Store{Address: []string{"127.0.0.1:1"}, PoolSize: -1}, "pool_size"},
		{Store{Address: []string{"127.0.0.1:1"}, DB: -1}, "db"},
		{Store{Address: []string{"127.0.0.1:1"}, DialTimeout: -1}, "timeouts"},
		{Store{Address: []string{"notaport"}}, `address "notaport": write host:port`},
		{Store{Address: []string{"127.0.0.1:1", "h:x"}}, `address "h:x": write host:port`},
	} {
		err := c.s.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: Provision() = %v, want an error naming %s", c.s, err, c.want)
		}
	}
	// A Unix socket's path is an address (go-redis dials it so), an @ in
	// a later segment too (systemd's user@1000).
	for _, path := range []string{filepath.Join(t.TempDir(), "redis.sock"), "/run/user@1000/redis.sock"} {
		sock := &Store{Address: []string{path}}
		if err := sock.Provision(ctx); err != nil {
			t.Errorf("a socket's path %s: %v", path, err)
		}
		_ = sock.Cleanup()
	}
}

// An unset placeholder is refused with the option's name, as the file
// store's path and PostgreSQL's dsn do: an unset {env.REDIS_URL} quietly
// became the default 127.0.0.1:6379 (another Redis, another dedup
// state), an unset password no password. A password's error names the
// placeholder only when it is the whole value.
func TestRedisStoreUnsetPlaceholderRefused(t *testing.T) {
	const unset = "SANGHO_DEDUP_TEST_UNSET_REDIS"
	os.Unsetenv(unset)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	ph := "{env." + unset + "}"
	for _, c := range []struct {
		s          Store
		want, hide string
	}{
		{Store{URL: ph}, "url: " + ph + " is unset or empty", ""},
		{Store{Address: []string{ph}}, "address: " + ph + " is unset or empty", ""},
		{Store{Address: []string{"127.0.0.1:1"}, Username: ph}, "username: " + ph + " is unset or empty", ""},
		{Store{Address: []string{"127.0.0.1:1"}, Password: ph}, "password: " + ph + " is unset or empty", ""},
		{Store{Address: []string{"127.0.0.1:1"}, Password: "s3cr{et}x"}, "password: a placeholder in it is unset, empty or unknown", "s3cr"},
		{Store{URL: "redis://:pw" + ph + "@127.0.0.1:1"}, "url: a placeholder in it is unset, empty or unknown", "redis://"},
		{Store{Address: []string{"127.0.0.1:1"}, MasterName: ph}, "master_name: " + ph + " is unset or empty", ""},
		// a literal brace pair is no placeholder: never quoted
		{Store{Address: []string{"127.0.0.1:1"}, Password: "{hunter2}"}, "password: a placeholder in it is unset, empty or unknown", "hunter2"},
		{Store{Address: []string{"127.0.0.1:1"}, Password: "{s3cr}t}"}, "password: a placeholder in it is unset, empty or unknown", "s3cr"},
		// the error of an unset file, not tls_client_auth's own
		{Store{Address: []string{"127.0.0.1:1"}, TLSClientCertificateFile: ph, TLSClientCertificateKeyFile: "/k.pem"}, "tls_client_auth: " + ph + " is unset or empty", ""},
	} {
		err := c.s.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), c.want) || (c.hide != "" && strings.Contains(err.Error(), c.hide)) {
			t.Errorf("%+v: Provision() = %v, want an error with %q", c.s, err, c.want)
		}
	}
}

// TestRedisRefusesALateClaimOnASharedClient: a delivery that enters a
// config after its Cleanup released the client is refused, also where
// another config (the same settings) still holds the client: that one
// counts no use for the delivery, and its own release would close the
// client under the delivery's commit. The other config's claims go on.
func TestRedisRefusesALateClaimOnASharedClient(t *testing.T) {
	srv := startRedis(t)
	old := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	cur := provisionRedisStore(t, &Store{Address: []string{srv.Addr}})
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	old.Enter()
	defer old.Leave()
	if res, _, err := old.Claim(ctx, "late", "t", time.Minute); !errors.Is(err, storepool.ErrUnloaded) {
		t.Fatalf("late claim = %v, %v; want %v", res, err, storepool.ErrUnloaded)
	}
	if res, _, err := cur.Claim(ctx, "late", "t", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("the running config's claim = %v, %v; want claimed", res, err)
	}
}
