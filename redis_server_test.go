package sanghodedup

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testhooks"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
	redisstore "github.com/sangho/caddy-sangho-dedup/stores/redis"
)

// TestRedisStoreLoggerName: the local cache's lines come from the
// store's own logger, http.sangho_dedup.stores.redis, the name the
// README gives (they came from ...stores.redis.redis).
func TestRedisStoreLoggerName(t *testing.T) {
	srv := startRedis(t)
	pw := redistest.ACLUser(t, srv.Client(t), "notrack", "", "+client|tracking")
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	ownDataDir(t)
	cfg, _ := adaptCaddyfile(t, fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output file %s
		format json
	}
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sangho_dedup {
		secret %s
		store redis {
			address %s
			username notrack
			password %s
			local_cache 10000
		}
	}
	respond 200
}
`, logFile, freePort(t), secret1, srv.Addr, pw))
	if err := caddyLoad(cfg); err != nil {
		t.Fatal(err)
	}
	defer caddy.Stop()
	var line map[string]any
	waitFor(t, "the local cache's warning in the log", func() bool {
		data, _ := os.ReadFile(logFile)
		for _, l := range strings.Split(string(data), "\n") {
			if strings.Contains(l, `"local_cache off"`) {
				return json.Unmarshal([]byte(l), &line) == nil
			}
		}
		return false
	})
	if line["logger"] != "http.sangho_dedup.stores.redis" {
		t.Fatalf("local_cache off logged by %q, want http.sangho_dedup.stores.redis", line["logger"])
	}
}

// TestServerEndpointsOnRedisSpelledTwoWays: two endpoints (named apart)
// with different secrets on one Redis and key_prefix, one writing
// localhost, the other 127.0.0.1, are refused like any two that share
// state.
func TestServerEndpointsOnRedisSpelledTwoWays(t *testing.T) {
	r := startRedis(t)
	_, port, _ := strings.Cut(r.Addr, ":")
	cfg, _ := adaptCaddyfile(t, serverCaddyfile(freePort(t), twoEndpoints("127.0.0.1:1", "127.0.0.1:1",
		"name a\n\t\t\t"+redisStoreLine("localhost:"+port), "name b\n\t\t\t"+redisStoreLine("127.0.0.1:"+port))))
	err := caddyLoad(cfg)
	defer caddy.Stop()
	if err == nil || !strings.Contains(err.Error(), "different secrets") {
		t.Fatalf("two endpoints with different secrets on one Redis (localhost and 127.0.0.1), one key_prefix: %v, want refused", err)
	}
}

// Every Redis timeout is bounded, in its option and in the url, with an
// error naming it: a read_timeout near the longest Duration validated,
// and the local cache's read deadline (heartbeat + read_timeout) wrapped
// into the past, so its connection was dropped every second (found by
// review).
func TestRedisTimeoutsBounded(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	over := (redisstore.MaxRedisTimeout + time.Second).String()
	for name, store := range map[string]string{
		"dial_timeout":  `{"type":"redis","address":["127.0.0.1:1"],"dial_timeout":"` + over + `"}`,
		"read_timeout":  `{"type":"redis","address":["127.0.0.1:1"],"read_timeout":"2562047h47m16.854775807s"}`,
		"write_timeout": `{"type":"redis","address":["127.0.0.1:1"],"write_timeout":"` + over + `"}`,
		"wait_timeout":  `{"type":"redis","address":["127.0.0.1:1"],"read_timeout":"1h","wait_timeout":"` + over + `"}`,
		"url":           `{"type":"redis","url":"redis://127.0.0.1:1/?read_timeout=7201"}`,
	} {
		h := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(store)}
		err := h.Provision(ctx)
		if err == nil {
			err = h.Validate()
		}
		want := name
		if name == "url" {
			want = "read_timeout"
		}
		if err == nil || !strings.Contains(err.Error(), want+" must be at most") {
			t.Errorf("%s: %v; want an error naming %s and its maximum", name, err, want)
		}
		_ = h.Cleanup()
	}
	h := &Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"redis","address":["127.0.0.1:1"],"read_timeout":"` + redisstore.MaxRedisTimeout.String() + `"}`)}
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("read_timeout at the maximum: %v", err)
	}
	_ = h.Cleanup()
}

// TestPermissionCheckAnswers503: the case end to end. With the
// old README recipe (no PEXPIRE, GET, DEL) a lease could not be renewed,
// so a slow backend's event was processed twice; now the delivery is
// answered 503 without reaching the backend, and processed once the ACL
// is fixed.
func TestPermissionCheckAnswers503(t *testing.T) {
	srv := startRedis(t)
	admin := srv.Client(t)
	pw := redistest.ACLUser(t, admin, "caddy", "", "+get", "+pexpire", "+del")
	h, _ := newTestHandler(t, func(h *Handler) {
		h.StoreRaw = []byte(`{"type":"redis","address":["` + srv.Addr + `"],"username":"caddy","password":"` + pw + `"}`)
	})
	next := &countingNext{}
	w, repl, _ := serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 503 || outcomeOf(repl) != outcomeStoreError || next.calls.Load() != 0 {
		t.Fatalf("with GET, PEXPIRE and DEL refused: %d %q, backend called %d times; want 503 and no call", w.Code, outcomeOf(repl), next.calls.Load())
	}
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "caddy", "+get", "+pexpire", "+del").Err(); err != nil {
		t.Fatal(err)
	}
	testhooks.RedisRecheckNow(h.store)
	w, _, _ = serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 200 || next.calls.Load() != 1 {
		t.Fatalf("after the ACL was fixed: %d, backend called %d times", w.Code, next.calls.Load())
	}
}
