package redis

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// TestRedisURLParametersHonoured: the url's query parameters take
// effect (they were parsed by go-redis and then dropped), client_name
// included: Redis lists the connection under that name.
func TestRedisURLParametersHonoured(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{URL: "redis://" + srv.Addr + "/0?pool_size=3&dial_timeout=1s&read_timeout=7s&write_timeout=2s&client_name=caddy-dedup"})
	o := s.client.(*goredis.Client).Options()
	if o.PoolSize != 3 || o.DialTimeout != time.Second || o.ReadTimeout != 7*time.Second || o.WriteTimeout != 2*time.Second || o.ClientName != "caddy-dedup" {
		t.Fatalf("effective options: pool %d dial %v read %v write %v name %q", o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.ClientName)
	}
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err != nil {
		t.Fatal(err)
	}
	if list := srv.Client(t).ClientList(ctx).Val(); !strings.Contains(list, "name=caddy-dedup ") {
		t.Fatalf("no connection named caddy-dedup in CLIENT LIST:\n%s", list)
	}
	// A plain number is seconds, as go-redis reads it.
	s = provisionRedisStore(t, &Store{URL: "redis://" + srv.Addr + "?read_timeout=4"})
	if rt := s.client.(*goredis.Client).Options().ReadTimeout; rt != 4*time.Second {
		t.Fatalf("read_timeout=4: %v", rt)
	}
}

// TestRedisURLUnix: a unix:// URL reaches Redis through its socket, with
// the database from the query.
func TestRedisURLUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "redis.sock")
	srv := redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	s := provisionRedisStore(t, &Store{URL: "unix://" + sock + "?db=2"})
	ctx := context.Background()
	if res, _, err := s.Claim(ctx, testKeyPrefix+"evt_unix", "tok", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim over the unix socket: %v %v", res, err)
	}
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, DB: 2})
	defer c.Close()
	if n := c.Exists(ctx, testKeyPrefix+"evt_unix").Val(); n != 1 {
		t.Fatal("the key is not in db 2")
	}
	if list := srv.Client(t).ClientList(ctx).Val(); !strings.Contains(list, "addr=/") && !strings.Contains(list, "flags=U") {
		t.Fatalf("no unix socket client in CLIENT LIST:\n%s", list)
	}
}

// TestRedisURLRefused: every query parameter, scheme and combination
// that is not honoured is a config error that names it, and none prints
// the password.
func TestRedisURLRefused(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	const pw = "hunter2secret"
	base := "redis://caddy:" + pw + "@127.0.0.1:6379"
	for _, c := range []struct {
		s    Store
		want string
	}{
		{Store{URL: base + "?max_retries=3"}, `url parameter "max_retries" is not supported`},
		{Store{URL: base + "?protocol=2"}, `url parameter "protocol" is not supported`},
		{Store{URL: base + "?password=x"}, `url parameter "password" is not supported`},
		{Store{URL: base + "?pool_size=1&pool_size=2"}, "url parameter pool_size given more than once"},
		{Store{URL: base + "?pool_size="}, "url parameter pool_size has no value"},
		{Store{URL: base + "?pool_size=0"}, "url parameter pool_size must be a positive whole number"},
		{Store{URL: base + "?pool_size=many"}, "url parameter pool_size must be a positive whole number"},
		{Store{URL: base + "?pool_size=99999999"}, "url parameter pool_size must be 1 to 10000"},
		{Store{URL: base + "?dial_timeout=-1"}, "url parameter dial_timeout must be a positive duration"},
		{Store{URL: base + "?read_timeout=0s"}, "url parameter read_timeout must be a positive duration"},
		{Store{URL: base + "?write_timeout=soon"}, "url parameter write_timeout must be a positive duration"},
		{Store{URL: base + "?db=x"}, "url parameter db must be a whole number"},
		{Store{URL: base + "/x"}, "the path after host:port must be a database number"},
		{Store{URL: base + "?skip_verify=true"}, "url parameter skip_verify needs a rediss:// url"},
		{Store{URL: "rediss://caddy:" + pw + "@h?skip_verify=maybe"}, "url parameter skip_verify must be true or false"},
		{Store{URL: "http://caddy:" + pw + "@h"}, `url scheme "http" is not supported`},
		{Store{URL: base + "?pool_size=3", PoolSize: 5}, "pool_size is set both in url and as an option"},
		{Store{URL: base + "?dial_timeout=1s", DialTimeout: caddy.Duration(time.Second)}, "dial_timeout is set both in url and as an option"},
		{Store{URL: base + "?read_timeout=1s", ReadTimeout: caddy.Duration(time.Second)}, "read_timeout is set both in url and as an option"},
		{Store{URL: base + "?write_timeout=1s", WriteTimeout: caddy.Duration(time.Second)}, "write_timeout is set both in url and as an option"},
		{Store{URL: base + "/1", DB: 2}, "db is set both in url and as an option"},
		{Store{URL: base + "?db=1", DB: 2}, "db is set both in url and as an option"},
		{Store{URL: base, Password: "other"}, "password is set both in url and as an option"},
		{Store{URL: base, Username: "other"}, "username is set both in url and as an option"},
		{Store{URL: base, Address: []string{"a:1"}}, "url cannot be combined with address, master_name or tls"},
		{Store{URL: base, TLS: true}, "url cannot be combined with address, master_name or tls"},
		{Store{URL: "unix://caddy:" + pw + "@/run/redis.sock", Cluster: true}, "cluster cannot be used with a unix:// url"},
		{Store{URL: base, TLSServerName: "x"}, "tls_server_name needs TLS: use a rediss:// url"},
		{Store{URL: base, TLSInsecureSkipVerify: true}, "tls_insecure_skip_verify needs TLS: use a rediss:// url"},
		{Store{URL: "unix://caddy:" + pw + "@/run/redis.sock", TLSClientCertificateFile: "c", TLSClientCertificateKeyFile: "k"}, "tls_client_auth needs TLS: use a rediss:// url"},
		{Store{URL: "redis://caddy:" + pw + "@ho st:6379"}, "invalid url"},
		{Store{URL: base + "?a=%zz"}, "invalid url"},
		{Store{URL: base + "?read_timeout=4s", WaitReplicas: 1, WaitTimeout: caddy.Duration(5 * time.Second)}, "wait_timeout must be shorter than read_timeout"},
		// go-redis reads these as localhost:6379, or drops a part: a
		// store other than the one written, with another dedup state.
		{Store{URL: "redis:redis.internal:6379"}, "url: the // after"},
		{Store{URL: "rediss:caddy:" + pw + "@redis.internal:6380"}, "url: the // after"},
		{Store{URL: "redis://"}, "url has no host"},
		{Store{URL: "redis:///0"}, "url has no host"},
		{Store{URL: "rediss://caddy:" + pw + "@:6380"}, "url has no host"},
		{Store{URL: "redis://127.0.0.1:0"}, "url: the port must be 1 to 65535"},
		{Store{URL: "redis://127.0.0.1:99999"}, "url: the port must be 1 to 65535"},
		{Store{URL: base + "/1?db=2"}, "url: the database is given both in the path and as db"},
		{Store{URL: base + "#0"}, "url holds a #"},
	} {
		s := c.s
		err := s.Provision(ctx)
		if err == nil {
			s.Cleanup()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.s.URL, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Errorf("%s: the error holds the password: %v", c.s.URL, err)
		}
	}
}

// TestRedisSharedClientKey: stores share a client only when every
// effective setting is the same, TLS included.
func TestRedisSharedClientKey(t *testing.T) {
	files := redistest.GenerateTLS(t)
	pool := func(ca string) []byte { return []byte(`{"provider":"file","pem_files":["` + ca + `"]}`) }
	same := [][2]Store{
		{{Address: []string{"a:1"}}, {Address: []string{"a:1"}}},
		{{URL: "rediss://a:1?pool_size=3"}, {URL: "rediss://a:1?pool_size=3"}},
		{{URL: "redis://a:1/2"}, {Address: []string{"a:1"}, DB: 2}},
		{{URL: "rediss://a:1", TLSTrustPoolRaw: pool(files.CA)}, {URL: "rediss://a:1", TLSTrustPoolRaw: pool(files.CA)}},
	}
	different := [][2]Store{
		{{URL: "rediss://a:1"}, {URL: "rediss://a:1?skip_verify=true"}},
		{{URL: "rediss://a:1"}, {URL: "rediss://a:1", TLSInsecureSkipVerify: true}},
		{{URL: "redis://a:1"}, {URL: "redis://a:1?client_name=x"}},
		{{URL: "redis://a:1"}, {URL: "redis://a:1?pool_size=3"}},
		{{URL: "redis://a:1"}, {URL: "redis://a:1?dial_timeout=2s"}},
		{{URL: "redis://a:1"}, {URL: "rediss://a:1"}},
		{{Address: []string{"a:1"}, TLS: true}, {Address: []string{"a:1"}, TLSServerName: "x"}},
		{{Address: []string{"a:1"}, TLS: true}, {Address: []string{"a:1"}, TLSTrustPoolRaw: pool(files.CA)}},
		{{Address: []string{"a:1"}, TLSTrustPoolRaw: pool(files.CA)}, {Address: []string{"a:1"}, TLSTrustPoolRaw: pool(files.OtherCA)}},
		{{Address: []string{"a:1"}, TLS: true}, {Address: []string{"a:1"}, TLSClientCertificateFile: files.ClientCert, TLSClientCertificateKeyFile: files.ClientKey}},
		{{Address: []string{"a:1"}, TLSClientCertificateFile: files.ClientCert, TLSClientCertificateKeyFile: files.ClientKey},
			{Address: []string{"a:1"}, TLSClientCertificateFile: files.OtherClientCert, TLSClientCertificateKeyFile: files.OtherClientKey}},
		{{Address: []string{"a:1"}}, {Address: []string{"a:1"}, Cluster: true}},
	}
	for i, p := range append(same, different...) {
		a, b := p[0], p[1]
		sa := provisionRedisStore(t, &a)
		sb := provisionRedisStore(t, &b)
		if shared := sa.client == sb.client; shared != (i < len(same)) {
			t.Errorf("%+v and %+v: shared client %v", p[0], p[1], shared)
		}
	}
}

// TestRedisURLClientNameNeedsSetname: a url's client_name makes every
// new connection run CLIENT SETNAME, which the README's ACL does not
// grant: the first claim names the missing permission, and granting it
// is enough.
func TestRedisURLClientNameNeedsSetname(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	pw := redistest.ACLUser(t, admin, "caddy", "")
	s := provisionRedisStore(t, &Store{URL: "redis://caddy:" + pw + "@" + srv.Addr + "?client_name=caddy-dedup"})
	logs := observeStore(s)
	s.check.retryEvery = 0
	ctx := context.Background()
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err == nil {
		t.Fatal("claim with client_name and no CLIENT SETNAME permission: no error")
	}
	if e := logs.FilterMessage(permLog).All(); len(e) != 1 || e[0].ContextMap()["command"] != "client|setname" {
		t.Fatalf("logs %v; want one error naming client|setname", logs.All())
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "caddy", "+client|setname").Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Claim(ctx, testKeyPrefix+"evt_1", "tok", time.Minute); err != nil {
		t.Fatalf("claim once CLIENT SETNAME is granted: %v", err)
	}
}

// TestRedisURLReadTimeoutAllowsLongerWait: a url's read_timeout counts
// when wait_timeout is checked against it (Validate runs after
// Provision).
func TestRedisURLReadTimeoutAllowsLongerWait(t *testing.T) {
	srv := startRedis(t)
	s := provisionRedisStore(t, &Store{URL: "redis://" + srv.Addr + "?read_timeout=10s", WaitReplicas: 1, WaitTimeout: caddy.Duration(5 * time.Second)})
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisConfigErrorHidesPartsOfThePassword: a password with an
// unescaped / ? or #, or a URL written where an address goes, made Go's
// URL parser (or the address check) quote a part of the password in the
// config error, which reaches Caddy's log and the admin API's answer.
// No error quotes any part of it, and each still says what to fix.
func TestRedisConfigErrorHidesPartsOfThePassword(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	const env = "SANGHO_DEDUP_TEST_REDIS_ADDR_URL"
	t.Setenv(env, "redis://default:Secr3tPart@127.0.0.1:1")
	for _, c := range []struct {
		s    Store
		want string
	}{
		{Store{URL: "redis://default:Secr3tPart/Rest9@127.0.0.1:6379/0"}, "percent-encode"},
		{Store{URL: "rediss://default:Secr3tPart+x?y@127.0.0.1:6379"}, "percent-encode"},
		{Store{URL: "redis://default:Secr3t#Part@127.0.0.1:6379"}, "percent-encode"},
		// The user and the head of the password read as host:port.
		{Store{URL: "redis://default:6380#Secr3tPart@redis.internal:6379"}, "percent-encode"},
		{Store{URL: "redis://u:12/Secr3tPart@127.0.0.1:6379"}, "must be a database number, such as /0 (a / in the password must be percent-encoded"},
		{Store{URL: "redis://u:123?db=Secr3tPart@127.0.0.1:6379"}, "url parameter db must be a whole number"},
		{Store{URL: "redis://u:123?pool_size=Secr3tPart@127.0.0.1:6379"}, "url parameter pool_size must be a positive whole number"},
		{Store{URL: "redis://u:123?dial_timeout=Secr3tPart@h"}, "url parameter dial_timeout must be a positive duration"},
		{Store{URL: "rediss://u:123?skip_verify=Secr3tPart@h"}, "url parameter skip_verify must be true or false"},
		{Store{URL: "redis://u:1?a=Secr3t%zzPart@h"}, "percent-encode"},
		{Store{Address: []string{"redis://default:Secr3tPart@127.0.0.1:1"}}, "address 1 (not shown"},
		{Store{Address: []string{"127.0.0.1:1", "default:Secr3tPart@127.0.0.1:1"}}, "address 2 (not shown"},
		{Store{Address: []string{"{env." + env + "}"}}, "address {env." + env + "}: write host:port"},
		{Store{URL: "redis://u:123?Secr3tPart@127.0.0.1:6379"}, "url parameter 1 is not supported"},
		{Store{URL: "redis://u:123?Secr3t=Part@127.0.0.1:6379"}, "url parameter 1 is not supported"},
		{Store{URL: "redis://u:12?db=0&Secr3tPart@127.0.0.1:6379"}, "url parameter 2 is not supported"},
		{Store{Address: []string{"default:Secr3tPart@{env." + env + "}"}}, "address 1 (not shown"},
		{Store{Address: []string{"redis://default:Secr3tPart@{env." + env + "}"}}, "address 1 (not shown"},
		// host:port by their shape, so they passed the check: the password
		// then came back in every store error and in go-redis's log.
		{Store{Address: []string{"Secr3tPart@127.0.0.1:6379"}}, "address 1 (not shown"},
		{Store{Address: []string{"//default:Secr3tPart@127.0.0.1:1"}}, "address 1 (not shown"},
		{Store{Address: []string{"/default:Secr3tPart@127.0.0.1:6379"}}, "address 1 (not shown"},
		{Store{Address: []string{"/Secr3tPart@host"}}, "address 1 (not shown"},
		{Store{Address: []string{"u/Secr3tPart@127.0.0.1:6379"}}, "address 1 (not shown"},
	} {
		s := c.s
		err := s.Provision(ctx)
		if err == nil {
			s.Cleanup()
			t.Errorf("%q %q: Provision succeeded, want an error", c.s.URL, c.s.Address)
			continue
		}
		if strings.Contains(err.Error(), "Secr3t") {
			t.Errorf("%q %q: the error quotes a part of the password: %v", c.s.URL, c.s.Address, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q %q: error %v, want it to contain %q", c.s.URL, c.s.Address, err, c.want)
		}
	}
}
