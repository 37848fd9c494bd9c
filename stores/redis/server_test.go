package redis_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	sanghodedup "github.com/sangho/caddy-sangho-dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/handlertest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
	redisstore "github.com/sangho/caddy-sangho-dedup/stores/redis"
)

// The Redis store under the handler.

// TestRedisStoreLoggerName: the local cache's lines come from the
// store's own logger, http.sangho_dedup.stores.redis, the name the
// README gives (they came from ...stores.redis.redis).
func TestRedisStoreLoggerName(t *testing.T) {
	srv := redistest.Start(t)
	pw := redistest.ACLUser(t, srv.Client(t), "notrack", "", "+client|tracking")
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	err := handlertest.Load(t, fmt.Sprintf(`{
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
`, logFile, netkit.FreePort(t), handlertest.Secret, srv.Addr, pw))
	if err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	handlertest.WaitFor(t, "the local cache's warning in the log", func() bool {
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
	r := redistest.Start(t)
	_, port, _ := strings.Cut(r.Addr, ":")
	endpoint := func(path, name, secret, addr string) string {
		return fmt.Sprintf(`	handle %s {
		sangho_dedup {
			secret %s
			name %s
			store redis {
				address %s
				dial_timeout 200ms
				read_timeout 500ms
			}
		}
		reverse_proxy 127.0.0.1:1
	}
`, path, secret, name, addr)
	}
	err := handlertest.Load(t, handlertest.Site(0, netkit.FreePort(t),
		endpoint("/a", "a", sangho.Secret1, "localhost:"+port)+endpoint("/b", "b", sangho.Secret2, "127.0.0.1:"+port)))
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
	over := (redisstore.MaxTimeout + time.Second).String()
	for name, store := range map[string]string{
		"dial_timeout":  `{"type":"redis","address":["127.0.0.1:1"],"dial_timeout":"` + over + `"}`,
		"read_timeout":  `{"type":"redis","address":["127.0.0.1:1"],"read_timeout":"2562047h47m16.854775807s"}`,
		"write_timeout": `{"type":"redis","address":["127.0.0.1:1"],"write_timeout":"` + over + `"}`,
		"wait_timeout":  `{"type":"redis","address":["127.0.0.1:1"],"read_timeout":"1h","wait_timeout":"` + over + `"}`,
		"url":           `{"type":"redis","url":"redis://127.0.0.1:1/?read_timeout=7201"}`,
	} {
		h := &sanghodedup.Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(store)}
		err := h.Provision(ctx)
		if err == nil {
			err = h.Validate()
		}
		want := name
		if name == "url" {
			want = "read_timeout"
		}
		if err == nil || !strings.Contains(err.Error(), want+": ") || !strings.Contains(err.Error(), " is over the maximum of 1h") {
			t.Errorf("%s: %v; want an error naming %s and its maximum", name, err, want)
		}
		_ = h.Cleanup()
	}
	h := &sanghodedup.Handler{Secrets: []string{"s"}, StoreRaw: json.RawMessage(`{"type":"redis","address":["127.0.0.1:1"],"read_timeout":"` + redisstore.MaxTimeout.String() + `"}`)}
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("read_timeout at the maximum: %v", err)
	}
	_ = h.Cleanup()
}

// TestPermissionCheckAnswers503: the case end to end. With the
// old README recipe (no PEXPIRE, GET, DEL) a lease could not be renewed,
// so a slow backend's event was processed twice; now the delivery is
// answered 503 without reaching the backend, and processed once the ACL
// is fixed (and the refusal's back-off has passed).
func TestPermissionCheckAnswers503(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	pw := redistest.ACLUser(t, admin, "caddy", "", "+get", "+pexpire", "+del")
	h := handlertest.Provision(t, &sanghodedup.Handler{
		StoreRaw: json.RawMessage(`{"type":"redis","address":["` + srv.Addr + `"],"username":"caddy","password":"` + pw + `"}`),
	})
	next := &handlertest.Next{}
	w, repl := handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), next)
	if w.Code != 503 || handlertest.Outcome(repl) != "store_error" || next.Calls.Load() != 0 {
		t.Fatalf("with GET, PEXPIRE and DEL refused: %d %q, backend called %d times; want 503 and no call", w.Code, handlertest.Outcome(repl), next.Calls.Load())
	}
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "caddy", "+get", "+pexpire", "+del").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(redisstore.CheckRetryEvery + 100*time.Millisecond)
	w, _ = handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), next)
	if w.Code != 200 || next.Calls.Load() != 1 {
		t.Fatalf("after the ACL was fixed: %d, backend called %d times", w.Code, next.Calls.Load())
	}
}

// TestPayloadMismatchOverRedisRecordForms: on Redis, an event whose done
// record is in either form (the JSON one written before compact records,
// by the same SET ... PX, or the compact one the store writes now)
// answers the same body as a duplicate and another body with 422,
// without reaching the backend.
func TestPayloadMismatchOverRedisRecordForms(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	h := handlertest.Provision(t, &sanghodedup.Handler{
		StoreRaw: json.RawMessage(`{"type":"redis","address":["` + srv.Addr + `"],"local_cache":0}`),
	})
	ctx := context.Background()
	for _, form := range []string{"json", "compact"} {
		id := "evt_form_" + form
		body := handlertest.EventBody(id)
		sum := sha256.Sum256([]byte(body))
		rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "charge.succeeded", Fingerprint: hex.EncodeToString(sum[:16])}
		val := rec.Encode()
		if form == "compact" {
			val = rec.EncodeCompact()
		}
		if err := c.Set(ctx, h.KeyPrefix+id, val, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		next := &handlertest.Next{}
		if w, repl := handlertest.Serve(h, handlertest.SignedRequest(body, ""), next); w.Code != 200 || handlertest.Outcome(repl) != "duplicate" {
			t.Errorf("%s record, same body: %d %s, want 200 duplicate", form, w.Code, handlertest.Outcome(repl))
		}
		other := body[:len(body)-1] + " }"
		if w, repl := handlertest.Serve(h, handlertest.SignedRequest(other, ""), next); w.Code != http.StatusUnprocessableEntity || handlertest.Outcome(repl) != "payload_mismatch" {
			t.Errorf("%s record, another body: %d %s, want 422 payload_mismatch", form, w.Code, handlertest.Outcome(repl))
		}
		if next.Calls.Load() != 0 {
			t.Errorf("%s record: the backend was reached", form)
		}
	}
}
