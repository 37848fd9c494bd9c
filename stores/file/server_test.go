package file_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	sanghodedup "github.com/sangho/caddy-sangho-dedup"
	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/handlertest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
	"github.com/sangho/caddy-sangho-dedup/stores/file"
)

// The file store under the handler: the handler's default store, and
// what a disk that does not complete a write does to deliveries.

// openAt opens the file store at path in this process: the one open
// file a handler on that path uses too.
func openAt(t *testing.T, path string) *file.Store {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	s := &file.Store{Path: path}
	if err := s.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Cleanup() })
	return s
}

func TestFileStoreCaddyfileErrors(t *testing.T) {
	for in, want := range map[string]string{
		"store file a b":                  "takes at most its path on its line",
		"store file a {\npath b\n}":       "path given more than once",
		"store file {\npath a\npath b\n}": "path given more than once",
		"store file {\npath\n}":           "path: needs a value",
		"store file {\nsize 1\n}":         `unrecognized file store option (not shown`,
		"store file {\npth /x\n}":         `unrecognized file store option (not shown, as it may be a secret; did you mean path?)`,
	} {
		var h sanghodedup.Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
}

// With no store configured, a handler gets the file store at its
// default path, in Caddy's data directory: its folder is created, and
// the handler's records are in that file.
func TestDefaultStoreIsTheFileStore(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	h := handlertest.Provision(t, &sanghodedup.Handler{KeyPrefix: "default_store_test:"})
	want := filepath.Join(os.Getenv("XDG_DATA_HOME"), "caddy", "sangho_dedup", "dedup.db")
	if file.DefaultPath() != want {
		t.Fatalf("DefaultPath %s, want %s", file.DefaultPath(), want)
	}
	if fi, err := os.Stat(file.StoreDir(want)); err != nil || !fi.IsDir() {
		t.Fatalf("the default store's folder was not created: %v", err)
	}
	if w, _ := handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), &handlertest.Next{}); w.Code != 200 {
		t.Fatalf("delivery: %d", w.Code)
	}
	fs := openAt(t, want)
	if fs.DataID() != "file "+file.StoreDir(want) {
		t.Fatalf("store %s, want the file %s", fs.DataID(), want)
	}
	if e, err := fs.Get(context.Background(), "default_store_test:evt_1QZtest000000000001"); err != nil || e.State() != "done" {
		t.Fatalf("the delivery's record in the default file: %+v, %v; want done", e, err)
	}
}

// TestFileStoreStalledDisk: while the disk does not complete a write,
// the backend's answer still goes out (the commit gives up after
// fileWriteTimeout and is retried in the background), and a redelivery
// meanwhile, later than lock_ttl, gets 409: the event stays leased until
// its record is on disk, never processed twice. (Found by review: the
// commit waited without bound and the lease ran out.)
func TestFileStoreStalledDisk(t *testing.T) {
	defer file.SetWriteTimeout(300 * time.Millisecond)()
	path := filepath.Join(t.TempDir(), "dedup.db")
	h := handlertest.Provision(t, &sanghodedup.Handler{
		LockTTL:  caddy.Duration(200 * time.Millisecond),
		StoreRaw: json.RawMessage(`{"type":"file","path":"` + path + `"}`),
	})
	fs := openAt(t, path)
	stalled, unblock := file.Stall(fs) // an fsync that hangs, once the lease is synced
	defer unblock()
	next := &handlertest.Next{}
	first := make(chan int, 1)
	go func() {
		w, _ := handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), next)
		first <- w.Code
	}()
	select {
	case code := <-first:
		if code != 200 {
			t.Fatalf("first delivery: %d, want the backend's 200", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's answer was held by the stalled disk")
	}
	<-stalled               // the commit's write was held
	time.Sleep(time.Second) // Sangho's retry comes later than lock_ttl
	if w, _ := handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), next); w.Code != http.StatusConflict {
		t.Fatalf("redelivery while the record is not on disk: %d, want 409", w.Code)
	}
	unblock() // the disk comes back: the retried commit lands
	handlertest.WaitFor(t, "the retried commit to land after the disk came back", func() bool {
		e, _ := fs.Get(context.Background(), h.KeyPrefix+"evt_1QZtest000000000001")
		return e.State() == "done"
	})
	if w, _ := handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), next); w.Header().Get("Sangho-Dedup") != "duplicate" {
		t.Fatalf("after the commit landed: %d %q, want a duplicate", w.Code, w.Header().Get("Sangho-Dedup"))
	}
	if n := next.Calls.Load(); n != 1 {
		t.Fatalf("the backend was called %d times, want once", n)
	}
}

// TestLongRetentionOnTheDefaultStore: on the default (file) store, a
// redelivery is answered as a duplicate with the longest retention
// allowed, and with a longer one that only a caller skipping Validate
// can set: the expiry saturates. (Found by review: with retention
// 100000d the expiry wrapped past 2262 into the past, and every
// redelivery was processed again, 3 of 3.)
func TestLongRetentionOnTheDefaultStore(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	for _, c := range []struct {
		name      string
		retention time.Duration
	}{
		{"the maximum", sanghodedup.MaxRetention},
		{"100000d", 100000 * 24 * time.Hour},
		{"the longest Duration", time.Duration(math.MaxInt64)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &sanghodedup.Handler{Secrets: []string{handlertest.Secret}, Retention: caddy.Duration(c.retention),
				KeyPrefix: fmt.Sprintf("long_retention_%d:", c.retention)}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := h.Provision(ctx); err != nil {
				t.Fatal(err)
			}
			defer h.Cleanup()
			err := h.Validate()
			if c.retention <= sanghodedup.MaxRetention && err != nil {
				t.Fatalf("validate: %v", err)
			}
			if c.retention > sanghodedup.MaxRetention && err == nil {
				t.Error("validated a retention past the maximum")
			}
			next := &handlertest.Next{}
			for i := range 4 {
				w, _ := handlertest.Serve(h, handlertest.SignedRequest(sangho.BodyA, ""), next)
				if w.Code != 200 || i > 0 && w.Header().Get("Sangho-Dedup") != "duplicate" {
					t.Fatalf("delivery %d: %d %q; want 200, then duplicates", i+1, w.Code, w.Header().Get("Sangho-Dedup"))
				}
			}
			if n := next.Calls.Load(); n != 1 {
				t.Fatalf("the backend was called %d times, want once", n)
			}
			if e, err := openAt(t, file.DefaultPath()).Get(ctx, h.KeyPrefix+"evt_1QZtest000000000001"); err != nil || e.State() != "done" {
				t.Fatalf("the record in the default file store: %+v, %v", e, err)
			}
		})
	}
}

// TestFileStoreForcedForgetDuringStalledCommit: a commit whose write the
// disk holds (its caller gave up, the event stays leased) and an
// operator's forced forget (the admin API's DELETE ?force=true)
// meanwhile: the forget is never undone when the write lands. Either it
// answers an error (it could not be ordered after the held write), or
// the next delivery is processed. (Found by review: the forget deleted
// the lease in memory and answered "forgotten", stopping the retries;
// then the held write landed and the next delivery was answered as a
// duplicate.)
func TestFileStoreForcedForgetDuringStalledCommit(t *testing.T) {
	defer file.SetWriteTimeout(time.Second)()
	path := filepath.Join(t.TempDir(), "dedup.db")
	next := &handlertest.Next{}
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = next.ServeHTTP(w, r) }))
	t.Cleanup(backend.Close)
	adminPort, port := netkit.FreePort(t), netkit.FreePort(t)
	if err := handlertest.Load(t, handlertest.Site(adminPort, port, fmt.Sprintf(`	sangho_dedup {
		secret %s
		store file %s
	}
	reverse_proxy %s`, handlertest.Secret, path, backend.Listener.Addr()))); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/webhook", port)
	api := fmt.Sprintf("http://127.0.0.1:%d/sangho_dedup/sangho_dedup:/events/evt_1QZtest000000000001", adminPort)
	fs := openAt(t, path)

	// The disk holds the write of the delivery's commit.
	first := make(chan int, 1)
	release := file.HoldInStalledWrite(t, fs,
		func() { go func() { first <- handlertest.Send(t, url, sangho.BodyA).Status }() },
		func() bool {
			e, ok := file.Lease(fs, "sangho_dedup:evt_1QZtest000000000001")
			return ok && time.Until(e.ExpiresAt) > dedup.CommitRetryFor // the commit extends the lease
		})
	if code := <-first; code != 200 { // the commit gave up; retried in the background
		t.Fatalf("first delivery: %d", code)
	}

	// The operator forgets the event, forced (it is leased).
	forced := handlertest.Do(t, http.MethodDelete, api+"?force=true", "", nil)
	t.Logf("forced forget during the stall: %+v", forced)

	release() // the disk comes back: the held write lands
	if forced.Status != 200 {
		// Refused: nothing was forgotten. Once the retries are done, the
		// operator forgets again.
		handlertest.WaitFor(t, "the commit retry to land", func() bool {
			e, _ := fs.Get(context.Background(), "sangho_dedup:evt_1QZtest000000000001")
			_, leased := file.Lease(fs, "sangho_dedup:evt_1QZtest000000000001")
			return e.State() == "done" && !leased
		})
		if a := handlertest.Do(t, http.MethodDelete, api, "", nil); a.Status != 200 {
			t.Fatalf("forget after the disk came back: %+v", a)
		}
	}
	a := handlertest.Send(t, url, sangho.BodyA)
	if a.Status != 200 || a.Dedup != "" || next.Calls.Load() != 2 {
		t.Fatalf("delivery after the forget: %d %q, backend called %d times; want it processed again",
			a.Status, a.Dedup, next.Calls.Load())
	}
}
