package file

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// fullDisk has the stores opened while it is set write through a file
// system that refuses writes with ENOSPC once full is on: every write,
// or (tablesOnly) the writes of tables, which are the large ones (a
// nearly full disk still takes the log's and the MANIFEST's).
func fullDisk(t *testing.T, tablesOnly bool) *atomic.Bool {
	t.Helper()
	full := new(atomic.Bool)
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && (!tablesOnly || strings.HasSuffix(op.Path, ".sst")) {
			return syscall.ENOSPC
		}
		return nil
	}))
	testFS = fs
	t.Cleanup(func() { testFS = nil })
	return full
}

// TestFileStoreFullDiskFailsClaimsNotCaddy: a write of the log refused
// (a full disk; EIO takes the same way) is one of Pebble's fatal
// errors. The store's logger panicked in its writer, and the panic
// ended the whole Caddy, every site with it. Now the store fails for
// good, logged once: claims and commits are errors (503, or passed on
// under on_store_error pass), at once, without touching the database;
// reads go on (a duplicate of a done event is still answered); and it
// closes without waiting for the database.
func TestFileStoreFullDiskFailsClaimsNotCaddy(t *testing.T) {
	full := fullDisk(t, false)
	st, logs := openObserved(t, filepath.Join(t.TempDir(), "dedup.db"), time.Now)
	s := &Store{state: st}
	ctx := context.Background()
	rec := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "t"}
	if res, _, err := s.Claim(ctx, "ev_done", "t1", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("claim before the disk filled: %v %v", res, err)
	}
	if held, err := s.Commit(ctx, "ev_done", "t1", rec, time.Hour); err != nil || !held {
		t.Fatalf("commit before the disk filled: %v %v", held, err)
	}
	full.Store(true)
	if res, _, err := s.Claim(ctx, "ev_new", "t2", time.Minute); err == nil {
		t.Fatalf("claim on a full disk: %v, no error", res)
	}
	start := time.Now()
	for _, key := range []string{"ev_a", "ev_b"} {
		if res, _, err := s.Claim(ctx, key, "t3", time.Minute); err == nil || !strings.Contains(err.Error(), "no space left on device") {
			t.Fatalf("claim after the failure: %v %v; want the failure, naming its cause", res, err)
		}
	}
	if _, err := s.Commit(ctx, "ev_new", "t2", rec, time.Hour); err == nil {
		t.Fatal("commit after the failure: no error")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the failed store took %v to refuse two claims and a commit; want at once", d)
	}
	if res, _, err := s.Claim(ctx, "ev_done", "t4", time.Minute); err != nil || res != dedup.AlreadyDone {
		t.Fatalf("a duplicate of a done event after the failure: %v %v; want done", res, err)
	}
	if n := logs.FilterMessage("file store failed").Len(); n != 1 {
		t.Fatalf("%d 'file store failed' log lines, want 1:\n%v", n, logs.All())
	}
	closed := make(chan error, 1)
	go func() { closed <- st.Destruct() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Destruct of the failed store did not return within 10 s")
	}
}

// TestFileStoreOpenOnAFullDiskIsAnError: a store opened on a disk that
// refuses writes (a restart after the disk filled) is an error naming
// the cause, not an open that waits for ever (Pebble retries the flush
// of its log's records; Caddy never started, and never said why).
func TestFileStoreOpenOnAFullDiskIsAnError(t *testing.T) {
	defer func(d time.Duration) { openGrace = d }(openGrace)
	openGrace = 200 * time.Millisecond
	for _, tablesOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "no write", true: "no table written"}[tablesOnly], func(t *testing.T) {
			full := fullDisk(t, tablesOnly)
			path := filepath.Join(t.TempDir(), "dedup.db")
			st := openUnclosed(t, path, time.Now)
			s := &Store{state: st}
			ctx := context.Background()
			for _, key := range []string{"ev_1", "ev_2"} {
				if res, _, err := s.Claim(ctx, key, "t", time.Minute); err != nil || res != dedup.Claimed {
					t.Fatalf("claim %s: %v %v", key, res, err)
				}
			}
			if err := st.Destruct(); err != nil {
				t.Fatal(err)
			}
			full.Store(true)
			opened := make(chan error, 1)
			go func() {
				st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
				if err == nil {
					st.Destruct()
				}
				opened <- err
			}()
			select {
			case err := <-opened:
				if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "no space left on device") {
					t.Fatalf("open on a full disk: %v; want an error naming the store and the cause", err)
				}
				t.Log(err)
			case <-time.After(30 * time.Second):
				t.Fatal("open on a full disk did not return within 30 s")
			}
			// An open given up on holds the folder (registered: another
			// path to it is refused) until it ends.
			if registered(StoreDir(path)) != tablesOnly {
				t.Fatalf("after the failed open, the folder registered: %v; want %v (an open given up on holds it)", !tablesOnly, tablesOnly)
			}
			// Space freed: an open given up on finishes and closes its
			// database, the folder's lock with it, so the store opens
			// again in this process (a reload), whole.
			full.Store(false)
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
				if err == nil {
					e, gerr := (&Store{state: st}).Get(ctx, "ev_2")
					st.Destruct()
					if gerr != nil || !dedup.IsLease(e.Value, "t") {
						t.Fatalf("after the space was freed, ev_2: %+v %v; want its lease", e, gerr)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the store did not open again within 20 s of the space freed: %v", err)
				}
			}
			if registered(StoreDir(path)) {
				t.Fatal("the folder is still registered once every open of it has ended")
			}
		})
	}
}

// TestBackgroundErrorLogIsBounded: Pebble retries a failed flush some
// 75 times a second; the store logs one line per backgroundErrorEvery,
// which counts the errors it did not log.
func TestBackgroundErrorLogIsBounded(t *testing.T) {
	defer func(d time.Duration) { backgroundErrorEvery = d }(backgroundErrorEvery)
	backgroundErrorEvery = 200 * time.Millisecond
	core, logs := observer.New(zapcore.InfoLevel)
	log := backgroundErrorLog("/x/dedup.db", zap.New(core))
	for range 50 {
		log(syscall.ENOSPC)
	}
	time.Sleep(250 * time.Millisecond)
	log(syscall.ENOSPC)
	lines := logs.FilterMessage("file store background error").All()
	if len(lines) != 2 {
		t.Fatalf("%d lines for 51 errors over 2 periods, want 2", len(lines))
	}
	if n := lines[1].ContextMap()["not_logged_since"]; n != int64(49) {
		t.Fatalf("the second line's not_logged_since = %v, want 49", n)
	}
}

// registered reports whether the folder dir is in openFolders.
func registered(dir string) bool {
	openFolders.Lock()
	defer openFolders.Unlock()
	return openFolders.m[dir] != nil
}

// TestClaimFolderCountsItsOpens: a folder stays registered while any
// open of it by its path is under way or open (two configs' opens race
// Pebble's lock; an open given up on ends late), and a release counts
// once, however often it is called.
func TestClaimFolderCountsItsOpens(t *testing.T) {
	dir := t.TempDir()
	r1, err := claimFolder("a.db", dir)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := claimFolder("a.db", dir)
	if err != nil {
		t.Fatal(err)
	}
	r1()
	r1()
	if !registered(dir) {
		t.Fatal("unregistered while a second open holds it")
	}
	r2()
	if registered(dir) {
		t.Fatal("still registered once both opens ended")
	}
}
