package file

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// TestWriterBatchReadsItsOwnWrites: within one batch of the writer (the
// txn that the writes of a group commit share, one after the other), a
// read of a done record sees what the batch set or deleted before it,
// as a forget after a commit of the same key or a retried commit behind
// its first attempt must; and the database ends as the batch left it.
func TestWriterBatchReadsItsOwnWrites(t *testing.T) {
	st := openTestShared(t, filepath.Join(t.TempDir(), "dedup.db"), time.Now)
	first := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "a"}.Encode()
	second := dedup.DoneRecord{ProcessedAt: time.Now(), EventType: "b"}.Encode()
	err := st.write(func(tx *txn) error {
		if _, _, ok, err := tx.record("k"); err != nil || ok {
			t.Errorf("before any write: found %v, err %v", ok, err)
		}
		if err := tx.put("k", first, time.Hour); err != nil {
			return err
		}
		if _, val, ok, err := tx.record("k"); err != nil || !ok || val != first {
			t.Errorf("after the set: %q, %v, %v; want %q", val, ok, err, first)
		}
		if same, err := tx.replace("k", doneValueOf(first), time.Hour); err != nil || !same {
			t.Errorf("a retried commit of the same record: same %v, err %v; want true", same, err)
		}
		if e, err := tx.forget("k"); err != nil || e.Value != first {
			t.Errorf("forget: %q, %v; want %q", e.Value, err, first)
		}
		if _, _, ok, err := tx.record("k"); err != nil || ok {
			t.Errorf("after the forget: found %v, err %v", ok, err)
		}
		if same, err := tx.replace("k", doneValueOf(second), time.Hour); err != nil || same {
			t.Errorf("a commit after the forget: same %v, err %v; want false", same, err)
		}
		// A key the batch never wrote reads from the database.
		if _, _, ok, err := tx.record("other"); err != nil || ok {
			t.Errorf("a key never written: found %v, err %v", ok, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if val, done, err := st.read("k"); err != nil || !done || val != second {
		t.Fatalf("after the batch: %q, %v, %v; want %q", val, done, err, second)
	}
	// The next batch reads the database; a record it deletes there is
	// gone for the rest of the batch.
	if err := st.write(func(tx *txn) error {
		if _, val, ok, err := tx.record("k"); err != nil || !ok || val != second {
			t.Errorf("in the next batch: %q, %v, %v; want %q", val, ok, err, second)
		}
		if e, err := tx.forget("k"); err != nil || e.Value != second {
			t.Errorf("forget: %q, %v; want %q", e.Value, err, second)
		}
		if _, val, ok, err := tx.record("k"); err != nil || ok {
			t.Errorf("after forgetting a record on disk: %q, found %v, err %v", val, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if val, done, err := st.read("k"); err != nil || done {
		t.Fatalf("after the forget's batch: %q, %v, %v; want nothing", val, done, err)
	}
}
