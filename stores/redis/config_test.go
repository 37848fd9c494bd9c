package redis

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
)

// parseRedisStore parses a `store redis { ... }` block.
func parseRedisStore(t *testing.T, block string) (Store, error) {
	t.Helper()
	var s Store
	err := s.UnmarshalCaddyfile(caddyfile.NewTestDispenser("redis {\n" + block + "\n}"))
	return s, err
}

func TestRedisCaddyfileNewOptions(t *testing.T) {
	for block, want := range map[string]Store{
		"cluster\naddress cfg.example:6379": {Cluster: true, Address: []string{"cfg.example:6379"}},
		"tls_client_auth /etc/caddy/redis.crt /etc/caddy/redis.key\ntls_server_name redis.internal\ntls_insecure_skip_verify": {
			TLSClientCertificateFile: "/etc/caddy/redis.crt", TLSClientCertificateKeyFile: "/etc/caddy/redis.key",
			TLSServerName: "redis.internal", TLSInsecureSkipVerify: true,
		},
		"url unix:///run/redis.sock?db=1": {URL: "unix:///run/redis.sock?db=1"},
		"local_cache 500":                 {LocalCache: intPtr(500)},
		"local_cache off":                 {LocalCache: intPtr(0)},
		"local_cache 0":                   {LocalCache: intPtr(0)},
	} {
		got, err := parseRedisStore(t, block)
		if err != nil {
			t.Errorf("%q: %v", block, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\ngot  %+v\nwant %+v", block, got, want)
		}
	}
}

// TestRedisCaddyfileTrustPool: tls_trust_pool takes Caddy's CA pool
// modules in reverse_proxy's forms (arguments or a block).
func TestRedisCaddyfileTrustPool(t *testing.T) {
	for block, want := range map[string]string{
		"tls_trust_pool file /etc/redis/ca.pem":            `{"pem_files":["/etc/redis/ca.pem"],"provider":"file"}`,
		"tls_trust_pool file {\npem_file /a.pem /b.pem\n}": `{"pem_files":["/a.pem","/b.pem"],"provider":"file"}`,
		"tls_trust_pool inline {\ntrust_der MIIB\n}":       `{"provider":"inline","trusted_ca_certs":["MIIB"]}`,
	} {
		got, err := parseRedisStore(t, block)
		if err != nil {
			t.Errorf("%q: %v", block, err)
			continue
		}
		var g, w any
		if err := json.Unmarshal(got.TLSTrustPoolRaw, &g); err != nil {
			t.Fatalf("%q: %v", block, err)
		}
		_ = json.Unmarshal([]byte(want), &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%q: %s, want %s", block, got.TLSTrustPoolRaw, want)
		}
	}
}

// TestRedisCaddyfileErrors: each bad value is a Caddyfile error that
// names the option.
func TestRedisCaddyfileErrors(t *testing.T) {
	for block, want := range map[string]string{
		"cluster yes":                  `cluster: takes no argument; the value is not repeated here`,
		"cluster\ncluster":             "cluster given more than once",
		"local_cache":                  "local_cache: needs a value",
		"local_cache -1":               `local_cache: must be a number of entries or off, not "-1"`,
		"local_cache on":               `local_cache: must be a number of entries or off, not "on"`,
		"local_cache 1 2":              "local_cache: takes one value",
		"local_cache 1\nlocal_cache 2": "local_cache given more than once",
	} {
		_, err := parseRedisStore(t, block)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", block, err, want)
		}
	}
}

// TestRedisConfigErrors: settings that cannot work together are refused
// at provision with an error that names them.
func TestRedisConfigErrors(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, c := range []struct {
		s    Store
		want string
	}{
		{Store{Cluster: true, MasterName: "m", Address: []string{"a:1"}}, "cluster cannot be combined with master_name"},
		{Store{Cluster: true, DB: 1}, "db must be 0 on a Redis Cluster"},
		{Store{Cluster: true, LocalCache: intPtr(100)}, "local_cache works with a standalone server only, not a Redis Cluster or Sentinel"},
		{Store{Address: []string{"a:1", "b:1"}, LocalCache: intPtr(100)}, "local_cache works with a standalone server only"},
		{Store{Address: []string{"a:1"}, MasterName: "m", LocalCache: intPtr(100)}, "local_cache works with a standalone server only"},
	} {
		s := c.s
		err := s.Provision(ctx)
		if err == nil {
			s.Cleanup()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to contain %q", c.s, err, c.want)
		}
	}
}

func intPtr(n int) *int { return &n }

// TestRedisLocalCacheDefaults: on by default with 10000 entries on a
// standalone server, off on a Cluster and behind Sentinel (also when
// set off explicitly; a size there is a config error: see
// TestRedisConfigErrors), and a negative size is refused.
func TestRedisLocalCacheDefaults(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, c := range []struct {
		s    Store
		want int
	}{
		// Opt-in: under realistic redelivery the cache costs more than it
		// saves (bench/REDIS-CLIENT-AB.md), and it cannot see SWAPDB.
		{Store{Address: []string{"127.0.0.1:1"}}, 0},
		{Store{Address: []string{"127.0.0.1:1", "127.0.0.1:2"}, MasterName: "m"}, 0},
		{Store{Address: []string{"127.0.0.1:1"}, MasterName: "m", LocalCache: intPtr(0)}, 0},
		{Store{Address: []string{"127.0.0.1:1"}, LocalCache: intPtr(7)}, 7},
		{Store{Address: []string{"127.0.0.1:1"}, LocalCache: intPtr(0)}, 0},
		{Store{Address: []string{"127.0.0.1:1", "127.0.0.1:2"}}, 0},
		{Store{Cluster: true, LocalCache: intPtr(0)}, 0},
	} {
		s := c.s
		o, err := s.options(ctx)
		if err != nil || o.cacheSize != c.want {
			t.Errorf("%+v: cache size %d, %v; want %d", c.s, o.cacheSize, err, c.want)
		}
	}
	if err := (&Store{LocalCache: intPtr(-1)}).Validate(); err == nil || !strings.Contains(err.Error(), "local_cache") {
		t.Errorf("negative local_cache: %v", err)
	}
}

// TestRedisDataIDSpellings: one Redis spelled two ways is one store
// state (the one-endpoint-one-prefix check, and a forget stopping the
// commit retries of its key, compare them); different servers or
// databases are not. Names are not resolved.
func TestRedisDataIDSpellings(t *testing.T) {
	off := 0
	state := func(s Store) string {
		t.Helper()
		s.LocalCache = &off // Provision dials nothing then
		return provisionRedisStore(t, &s).DataID()
	}
	addr := func(a ...string) Store { return Store{Address: a} }
	// Two addresses make a Cluster client, which asks its nodes who they
	// are (identity.go): loopback addresses on a port nothing listens on
	// refuse at once, so the test stays fast and on this machine.
	p := strconv.Itoa(netkit.FreePort(t))
	n1, n2 := "127.0.0.2:"+p, "127.0.0.3:"+p
	same := [][]Store{
		{addr("127.0.0.1:6379"), addr("localhost:6379"), addr("LocalHost:6379"), addr("[::1]:6379"), addr("[::ffff:127.0.0.1]:6379"),
			addr("127.0.0.1:06379"), {}, {URL: "redis://localhost"}, {URL: "redis://127.0.0.1:6379/0"}, {URL: "redis://[::1]:6379?db=0"}},
		{addr("redis.internal:6379"), addr("Redis.Internal.:6379"), {URL: "rediss://redis.INTERNAL:6379"}},
		{addr(n1, n2), addr(n2, n1)},
		{{URL: "redis://localhost", DB: 2}, {Address: []string{"127.0.0.1:6379"}, DB: 2}, {URL: "redis://127.0.0.1/2"}},
		{{URL: "unix:///run/redis/redis.sock"}, {URL: "unix:///run/redis//redis.sock"}},
	}
	seen := map[string]int{}
	for i, group := range same {
		want := state(group[0])
		for _, s := range group[1:] {
			if got := state(s); got != want {
				t.Errorf("group %d: %+v is %q, %+v is %q: one Redis, two store states", i, group[0], want, s, got)
			}
		}
		if j, ok := seen[want]; ok {
			t.Errorf("groups %d and %d are different Redis data but share the state %q", j, i, want)
		}
		seen[want] = i
	}
	local := state(same[0][0])
	for _, other := range []Store{addr("127.0.0.1:6380"), addr("127.0.0.2:6379"), addr("127.0.0.3:6379"), {DB: 1}, {URL: "redis://localhost/1"}} {
		if got := state(other); got == local {
			t.Errorf("%+v is %q, the same state as 127.0.0.1:6379 db 0", other, got)
		}
	}
}
