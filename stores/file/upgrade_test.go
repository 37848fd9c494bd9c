package file

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// testdata/v1-dedup.db and testdata/v2-dedup.db are store files of
// earlier releases (one bbolt file): v1 as the file store was before its
// in-memory index (commit 1e5b1d6: freelist synced, buckets events,
// expiry and leases), v2 as the last bbolt release wrote it (commit
// 3e7e829, same buckets). Each was written by the TestWriteV1Testdata of
// its commit, checked out:
//
//	SANGHO_DEDUP_WRITE_TESTDATA=1 go test -run TestWriteV1Testdata ./stores/file
//
// (v2 with the test's output name changed to v2-dedup.db).
// Its records, with the clock at v1Now:
var (
	v1Now  = time.Unix(1733140800, 0)     // 2024-12-02
	v1Done = map[string]dedup.DoneRecord{ // retention 200 years: live whenever the test runs
		"sangho_dedup:evt_1A2b3C4d5E6f7G8h": {ProcessedAt: v1Now, EventType: "payment_intent.succeeded"},
		"sangho_dedup:evt_9Z8y7X6w5V4u3T2s": {ProcessedAt: v1Now, EventType: "charge.refunded"},
		"other:evt_1A2b3C4d5E6f7G8h":        {ProcessedAt: v1Now, EventType: "customer.created"},
	}
	v1Expired     = "sangho_dedup:evt_expired" // retention 1 hour: expired long ago
	v1Parked      = "sangho_dedup:evt_parked"  // a lease parked by a clean stop, 200 years
	v1ParkedToken = "tok-parked"
)

// TestFileStoreTakesOverOldFiles: a store file of an earlier release is
// taken over at the first start: the done records are duplicates (with
// their values), the expired one is not (and is swept), the parked
// lease is held; the log names the old file, which is left byte for
// byte as it was; the next start opens the new store (the old file is
// not read again) with everything kept, the record written since too.
func TestFileStoreTakesOverOldFiles(t *testing.T) {
	for _, name := range []string{"v1-dedup.db", "v2-dedup.db"} {
		t.Run(name, func(t *testing.T) { testTakeOver(t, name) })
	}
}

func testTakeOver(t *testing.T, name string) {
	src, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for round := range 2 {
		core, logs := observer.New(zapcore.InfoLevel)
		st, err := openShared(path, time.Now, time.Hour, zap.New(core))
		if err != nil {
			t.Fatalf("round %d: opening the old file: %v", round, err)
		}
		took := logs.FilterMessage("old store file taken over").All()
		if round == 0 {
			if len(took) != 1 || took[0].ContextMap()["old_file"] != path || took[0].ContextMap()["folder"] != StoreDir(path) ||
				took[0].ContextMap()["done_records"] != int64(len(v1Done)+1) || took[0].ContextMap()["parked_leases"] != int64(1) {
				t.Fatalf("the takeover's log line: %+v", took)
			}
		} else if len(took) != 0 {
			t.Fatalf("round 1 took the old file over again: %+v", took)
		}
		s := &Store{state: st}
		for key, rec := range v1Done {
			res, val, err := s.Claim(ctx, key, "t-new", time.Minute)
			if err != nil || res != dedup.AlreadyDone || val != rec.Encode() {
				t.Fatalf("round %d: claim %s = %v %q %v; want already done %q", round, key, res, val, err, rec.Encode())
			}
			if e, err := s.Get(ctx, key); err != nil || e.Value != rec.Encode() || e.ExpiresAt.Before(time.Now().Add(100*365*24*time.Hour)) {
				t.Fatalf("round %d: get %s = %+v %v", round, key, e, err)
			}
		}
		if res, val, err := s.Claim(ctx, v1Parked, "t-new", time.Minute); err != nil || res != dedup.InFlight || val != "inflight:"+v1ParkedToken {
			t.Fatalf("round %d: claim of the parked lease = %v %q %v; want in flight", round, res, val, err)
		}
		if round == 0 {
			if e, err := s.Get(ctx, v1Expired); err != nil || e.Value != "" {
				t.Fatalf("expired record: get = %+v %v; want nothing", e, err)
			}
			if n, err := st.sweep(); err != nil || n != 1 {
				t.Fatalf("sweep of the old file's records = %d, %v; want the one expired record", n, err)
			}
			if res, _, err := s.Claim(ctx, v1Expired, "t-new", time.Minute); err != nil || res != dedup.Claimed {
				t.Fatalf("claim of the expired record = %v %v; want claimed", res, err)
			}
			if _, err := s.Release(ctx, v1Expired, "t-new"); err != nil {
				t.Fatal(err)
			}
			// a new record, written by this version, read back in round 1
			if _, err := s.Commit(ctx, "sangho_dedup:evt_new", "t-new", dedup.DoneRecord{ProcessedAt: v1Now, EventType: "new"}, time.Hour); err != nil {
				t.Fatal(err)
			}
		} else {
			if res, _, err := s.Claim(ctx, "sangho_dedup:evt_new", "t-new2", time.Minute); err != nil || res != dedup.AlreadyDone {
				t.Fatalf("record written by this version, after reopening: claim = %v %v", res, err)
			}
			if n, err := s.Entries(); err != nil || n != len(v1Done)+1 {
				t.Fatalf("entries after reopening = %d %v; want the %d done records and the new one", n, err, len(v1Done))
			}
		}
		if err := st.Destruct(); err != nil {
			t.Fatal(err)
		}
		if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, src) {
			t.Fatalf("round %d: the old file was changed (%v)", round, err)
		}
	}
	// the lease was parked again, in the new store
	db, err := pebble.Open(StoreDir(path), &pebble.Options{Logger: pebbleLogger{path, zap.NewNop()}, ErrorIfNotExists: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	raw, closer, err := db.Get(leaseKey(v1Parked))
	if err != nil {
		t.Fatalf("the parked lease was not parked again: %v", err)
	}
	defer closer.Close()
	if exp, val, err := decodeRecord(raw); err != nil || exp < unixNano(time.Now()) || string(val) != "inflight:"+v1ParkedToken {
		t.Fatalf("the parked lease, parked again: %q", raw)
	}
}

// An earlier release still running on its file: the first start of this
// version refuses to take the file over, naming it, and creates nothing.
func TestFileStoreTakeOverWaitsForTheOldRelease(t *testing.T) {
	src, err := os.ReadFile("testdata/v2-dedup.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := bolt.Open(path, 0o600, nil) // the earlier release holds its lock
	if err != nil {
		t.Fatal(err)
	}
	_, err = openShared(path, time.Now, time.Hour, zap.NewNop())
	old.Close()
	if !errors.Is(err, errFileLocked) || !strings.Contains(err.Error(), path) {
		t.Fatalf("error = %v; want one that names %s in use", err, path)
	}
	if _, err := os.Lstat(StoreDir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a store was created: %v", err)
	}
	st, err := openShared(path, time.Now, time.Hour, zap.NewNop()) // the old release stopped
	if err != nil {
		t.Fatal(err)
	}
	st.Destruct()
}

// The way back of docs/stores.md: after the takeover, the earlier
// release's file still opens (bbolt, as that release does) with its
// records; and with the folder moved away, the next start of this
// version takes the file over again.
func TestFileStoreWayBack(t *testing.T) {
	src, err := os.ReadFile("testdata/v2-dedup.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := openShared(path, time.Now, time.Hour, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	old, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second}) // the earlier release
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = old.View(func(tx *bolt.Tx) error { n = tx.Bucket(bucketEvents).Stats().KeyN; return nil })
	old.Close()
	if n != len(v1Done)+1 {
		t.Fatalf("the old file holds %d records, want %d", n, len(v1Done)+1)
	}
	if err := os.Rename(StoreDir(path), StoreDir(path)+".moved"); err != nil { // moved away
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	st, err = openShared(path, time.Now, time.Hour, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Destruct()
	if logs.FilterMessage("old store file taken over").Len() != 1 {
		t.Fatal("the file was not taken over again")
	}
	for key := range v1Done {
		if _, ok, err := st.read(key); err != nil || !ok {
			t.Fatalf("%s after the second takeover: %v %v", key, ok, err)
		}
	}
}
