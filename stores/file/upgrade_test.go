package file

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// testdata/v1-dedup.db is a database written by the file store as it was
// before the in-memory index (commit 1e5b1d6: freelist synced, buckets
// events, expiry and leases), by TestWriteV1Testdata run at that commit:
//
//	SANGHO_DEDUP_WRITE_TESTDATA=1 go test -run TestWriteV1Testdata ./stores/file
//
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
	v1Retention   = 200 * 365 * 24 * time.Hour
)

// TestWriteV1Testdata writes testdata/v1-dedup.db (see above); it runs
// only when asked to.
func TestWriteV1Testdata(t *testing.T) {
	if os.Getenv("SANGHO_DEDUP_WRITE_TESTDATA") == "" {
		t.Skip("set SANGHO_DEDUP_WRITE_TESTDATA=1 to write testdata/v1-dedup.db")
	}
	path, err := filepath.Abs("testdata/v1-dedup.db")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.MkdirAll(filepath.Dir(path), 0o755)
	_ = os.Remove(path)
	clock := func() time.Time { return v1Now }
	st, err := openFileState(path, clock, time.Hour, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{state: st}
	ctx := context.Background()
	for key, rec := range v1Done {
		if res, _, err := s.Claim(ctx, key, "t", time.Minute); err != nil || res != dedup.Claimed {
			t.Fatal(key, res, err)
		}
		if _, err := s.Commit(ctx, key, "t", rec, v1Retention); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Commit(ctx, v1Expired, "t", dedup.DoneRecord{ProcessedAt: v1Now, EventType: "old"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, _, err := s.Claim(ctx, v1Parked, v1ParkedToken, v1Retention); err != nil || res != dedup.Claimed {
		t.Fatal(res, err)
	}
	if err := st.Destruct(); err != nil { // parks the lease
		t.Fatal(err)
	}
}

// v1Raw reads the raw value of key in bucket from a closed database.
func v1Raw(t *testing.T, path string, bucket []byte, key string) []byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v []byte
	_ = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucket); b != nil {
			v = append([]byte(nil), b.Get([]byte(key))...)
		}
		return nil
	})
	return v
}

// TestFileStoreOpensV1File: a database written before the in-memory
// index opens with every record kept: the done records are duplicates
// (with their values), the expired one is not, the parked lease is held;
// the sweeper deletes the expired record; and the file opens again after
// this version wrote to it.
func TestFileStoreOpensV1File(t *testing.T) {
	src, err := os.ReadFile("testdata/v1-dedup.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dedup.db")
	if err := os.WriteFile(path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for round := range 2 {
		st, err := openFileState(path, time.Now, time.Hour, zap.NewNop())
		if err != nil {
			t.Fatalf("round %d: opening the v1 file: %v", round, err)
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
		if res, val, err := s.Claim(ctx, v1Parked, "t-new", time.Minute); err != nil || res != dedup.InFlight {
			t.Fatalf("round %d: claim of the parked lease = %v %q %v; want in flight", round, res, val, err)
		}
		if round == 0 {
			if e, err := s.Get(ctx, v1Expired); err != nil || e.Value != "" {
				t.Fatalf("expired record: get = %+v %v; want nothing", e, err)
			}
			if n, err := st.sweep(); err != nil || n != 1 {
				t.Fatalf("sweep of the v1 file = %d, %v; want the one expired record", n, err)
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
		} else if res, _, err := s.Claim(ctx, "sangho_dedup:evt_new", "t-new2", time.Minute); err != nil || res != dedup.AlreadyDone {
			t.Fatalf("record written by this version, after reopening: claim = %v %v", res, err)
		}
		if err := st.Destruct(); err != nil {
			t.Fatal(err)
		}
	}
	if raw := v1Raw(t, path, bucketEvents, v1Expired); len(raw) != 0 {
		t.Fatalf("the expired record is still in the file: %q", raw)
	}
	if raw := v1Raw(t, path, bucketLeases, v1Parked); len(raw) < 8 || binary.BigEndian.Uint64(raw) < unixNano(time.Now()) {
		t.Fatalf("the parked lease was not parked again: %q", raw)
	}
}
