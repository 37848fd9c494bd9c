package sanghodedup

import (
	"context"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testhooks"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

func TestFileStoreCaddyfileErrors(t *testing.T) {
	for in, want := range map[string]string{
		"store file a b":                  "wrong argument count",
		"store file a {\npath b\n}":       "path given more than once",
		"store file {\npath a\npath b\n}": "path given more than once",
		"store file {\npath\n}":           "path: needs a value",
		"store file {\nsize 1\n}":         `unrecognized file store option "size"`,
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
}

// With no store configured, a handler gets the file store at its
// default path, in Caddy's data directory.
func TestDefaultStoreIsTheFileStore(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{Secrets: []string{secret1}, KeyPrefix: "default_store_test:"}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	fs, ok := h.store.(*filestore.Store)
	if !ok {
		t.Fatalf("default store is %T, want *file.Store", h.store)
	}
	want := filepath.Join(os.Getenv("XDG_DATA_HOME"), "caddy", "sangho_dedup", "dedup.db")
	if fs.StateID() != "file "+filestore.StoreDir(want) || filestore.DefaultFilePath() != want {
		t.Fatalf("default store %s (DefaultFilePath %s), want the file %s", fs.StateID(), filestore.DefaultFilePath(), want)
	}
	if fi, err := os.Stat(filestore.StoreDir(want)); err != nil || !fi.IsDir() {
		t.Fatalf("the default store's folder was not created: %v", err)
	}
}

// TestFileStoreStalledDisk: while the disk does not complete a write,
// the backend's answer still goes out (the commit gives up after
// fileWriteTimeout and is retried in the background), and a redelivery
// meanwhile, later than lock_ttl, gets 409: the event stays leased until
// its record is on disk, never processed twice. (Found by review: the
// commit waited without bound and the lease ran out.)
func TestFileStoreStalledDisk(t *testing.T) {
	defer testhooks.FileWriteTimeout(300 * time.Millisecond)()
	path := filepath.Join(t.TempDir(), "dedup.db")
	h, _ := newTestHandler(t, func(h *Handler) {
		h.LockTTL = caddy.Duration(200 * time.Millisecond)
		h.StoreRaw = []byte(`{"type":"file","path":"` + path + `"}`)
	})
	stalled, unblock := testhooks.FileStall(h.store) // an fsync that hangs
	<-stalled
	next := &countingNext{}
	first := make(chan int, 1)
	go func() { w, _, _ := serve(h, signedRequest(bodyA, ""), next); first <- w.Code }()
	select {
	case code := <-first:
		if code != 200 {
			t.Fatalf("first delivery: %d, want the backend's 200", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the backend's answer was held by the stalled disk")
	}
	time.Sleep(time.Second) // Sangho's retry comes later than lock_ttl
	if w, _, _ := serve(h, signedRequest(bodyA, ""), next); w.Code != http.StatusConflict {
		t.Fatalf("redelivery while the record is not on disk: %d, want 409", w.Code)
	}
	unblock() // the disk comes back: the retried commit lands
	deadline := time.Now().Add(10 * time.Second)
	for {
		if e, _ := h.store.Get(context.Background(), h.KeyPrefix+"evt_1QZtest000000000001"); e.State() == "done" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the retried commit did not land after the disk came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if w, _, _ := serve(h, signedRequest(bodyA, ""), next); w.Header().Get("Sangho-Dedup") != "duplicate" {
		t.Fatalf("after the commit landed: %d %q, want a duplicate", w.Code, w.Header().Get("Sangho-Dedup"))
	}
	if n := next.calls.Load(); n != 1 {
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
	for _, c := range []struct {
		name      string
		retention time.Duration
	}{
		{"the maximum", MaxRetention},
		{"100000d", 100000 * 24 * time.Hour},
		{"the longest Duration", time.Duration(math.MaxInt64)},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &Handler{Secrets: []string{secret1}, now: testClock, Retention: caddy.Duration(c.retention),
				KeyPrefix: "long_retention_" + strconv.FormatInt(int64(c.retention), 36) + ":"}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := h.Provision(ctx); err != nil {
				t.Fatal(err)
			}
			defer h.Cleanup()
			if _, ok := h.store.(*filestore.Store); !ok {
				t.Fatalf("the default store is %T", h.store)
			}
			err := h.Validate()
			if c.retention <= MaxRetention && err != nil {
				t.Fatalf("validate: %v", err)
			}
			if c.retention > MaxRetention && err == nil {
				t.Error("validated a retention past the maximum")
			}
			next := &countingNext{}
			for i := range 4 {
				w, _, _ := serve(h, signedRequest(bodyA, ""), next)
				if w.Code != 200 || i > 0 && w.Header().Get("Sangho-Dedup") != "duplicate" {
					t.Fatalf("delivery %d: %d %q; want 200, then duplicates", i+1, w.Code, w.Header().Get("Sangho-Dedup"))
				}
			}
			if n := next.calls.Load(); n != 1 {
				t.Fatalf("the backend was called %d times, want once", n)
			}
		})
	}
}

// TestAbandonedCommitRetriesLoggedByTheHandler: the exit hook's
// "commit retries abandoned at exit" comes out through the logger of the
// handler whose retries it abandons (http.handlers.sangho_dedup, with
// that handler's sinks), like every other line of the handler. (Found by
// review: it went to caddy.Log().)
func TestAbandonedCommitRetriesLoggedByTheHandler(t *testing.T) {
	defer testhooks.FileWriteTimeout(100 * time.Millisecond)()
	defer func(g time.Duration) { exitCommitGrace = g }(exitCommitGrace)
	exitCommitGrace = 300 * time.Millisecond
	path := filepath.Join(t.TempDir(), "dedup.db")
	h, _ := newTestHandler(t, func(h *Handler) { h.StoreRaw = []byte(`{"type":"file","path":"` + path + `"}`) })
	core, logs := observer.New(zapcore.DebugLevel)
	h.logger = zap.New(core).Named("http.handlers.sangho_dedup")
	stalled, unblock := testhooks.FileStall(h.store) // a disk that does not answer
	<-stalled
	if w, _, _ := serve(h, signedRequest(bodyA, ""), &countingNext{}); w.Code != 200 {
		t.Fatalf("delivery: %d", w.Code)
	}
	if pendingCommits.Load() == 0 {
		t.Fatal("the commit did not go to the background retries")
	}
	go func() {
		// Once the retries are abandoned, the disk comes back: the exit
		// hook then parks the leases (it waits for the disk too), and
		// the retry lands and ends.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if logs.FilterMessage("commit retries abandoned at exit").Len() > 0 {
				break
			}
		}
		unblock()
	}()
	drainCommitRetries(context.Background())
	waitFor(t, "the commit retry to end", func() bool { return pendingCommits.Load() == 0 })
	lines := logs.FilterMessage("commit retries abandoned at exit").All()
	if len(lines) != 1 || lines[0].LoggerName != "http.handlers.sangho_dedup" || lines[0].Level != zapcore.ErrorLevel {
		t.Fatalf("abandoned retries logged through the handler's logger: %+v", lines)
	}
	if f := lines[0].ContextMap(); f["events"] != int64(1) {
		t.Fatalf("fields %v, want events 1", f)
	}
}

// TestFileStoreForcedForgetDuringStalledCommit: a commit whose write the
// disk holds (its caller gave up, the event stays leased) and an
// operator's forced forget meanwhile: the forget is never undone when
// the write lands. Either it answers an error (it could not be ordered
// after the held write), or the next delivery is processed. (Found by
// review: the forget deleted the lease in memory and answered
// "forgotten", stopping the retries; then the held write landed and the
// next delivery was answered as a duplicate.)
func TestFileStoreForcedForgetDuringStalledCommit(t *testing.T) {
	defer testhooks.FileWriteTimeout(time.Second)()
	path := filepath.Join(t.TempDir(), "dedup.db")
	h, _ := newTestHandler(t, func(h *Handler) { h.StoreRaw = []byte(`{"type":"file","path":"` + path + `"}`) })
	key := h.KeyPrefix + "evt_1QZtest000000000001"

	// The disk holds the write of the delivery's commit.
	next := &countingNext{}
	first := make(chan int, 1)
	release := testhooks.HoldInStalledWrite(t, h.store,
		func() { go func() { w, _, _ := serve(h, signedRequest(bodyA, ""), next); first <- w.Code }() },
		func() bool {
			e, ok := testhooks.FileLease(h.store, key)
			return ok && time.Until(e.ExpiresAt) > dedup.CommitRetryFor // the commit extends the lease
		})
	if code := <-first; code != 200 { // the commit gave up; retried in the background
		t.Fatalf("first delivery: %d", code)
	}

	// The operator forgets the event, forced (it is leased).
	e, deleted, ferr := h.forget(context.Background(), key, true)
	t.Logf("forced forget during the stall: %+v, deleted %v, %v", e, deleted, ferr)

	release() // the disk comes back: the held write lands
	if ferr == nil {
		if !deleted {
			t.Fatalf("forced forget of a leased event: not deleted")
		}
	} else {
		// Refused: nothing was forgotten. Once the retries are done, the
		// operator forgets again.
		waitFor(t, "the commit retries to end", func() bool { return pendingCommits.Load() == 0 })
		if _, deleted, err := h.forget(context.Background(), key, false); err != nil || !deleted {
			t.Fatalf("forget after the disk came back: %v, %v", deleted, err)
		}
	}
	w, _, _ := serve(h, signedRequest(bodyA, ""), next)
	if w.Code != 200 || w.Header().Get("Sangho-Dedup") != "" || next.calls.Load() != 2 {
		t.Fatalf("delivery after the forget: %d %q, backend called %d times; want it processed again",
			w.Code, w.Header().Get("Sangho-Dedup"), next.calls.Load())
	}
}
