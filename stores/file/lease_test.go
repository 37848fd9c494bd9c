package file

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/testclock"
)

// openObserved opens the store at path with its log kept, for a test
// that closes it.
func openObserved(t *testing.T, path string, now func() time.Time) (*shared, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	st, err := openShared(path, now, time.Hour, zap.New(core))
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	return st, logs
}

// tableDeletions flushes the memtable and counts the deletions in the
// tables.
func tableDeletions(t *testing.T, st *shared) uint64 {
	t.Helper()
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	levels, err := st.db.SSTables(pebble.WithProperties())
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, l := range levels {
		for _, tb := range l {
			n += tb.Properties.NumDeletions
		}
	}
	return n
}

// leasesOnDisk returns the keys of the leases in the database.
func leasesOnDisk(t *testing.T, st *shared) []string {
	t.Helper()
	it, err := st.db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixLease}, UpperBound: []byte{prefixLease + 1}})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, string(it.Key()[1:]))
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// noMisuse fails the test if Pebble reported a misuse of its API.
func noMisuse(t *testing.T, logs *observer.ObservedLogs) {
	t.Helper()
	if l := logs.FilterMessageSnippet("misuse").All(); len(l) > 0 {
		t.Fatalf("Pebble reported %d misuses, the first: %s %v", len(l), l[0].Message, l[0].ContextMap())
	}
}

// A new event's lease, claimed and committed, leaves nothing in the
// tables: its deletion (a SingleDelete) and its write annul each other
// in the flush of the memtable that holds both. A Delete would stay, one
// per event, and travel down the levels with the compactions.
func TestFileStoreCommittedLeaseLeavesNothing(t *testing.T) {
	clock := testclock.New()
	clock.Advance(time.Since(clock.Now()))
	st, logs := openObserved(t, filepath.Join(t.TempDir(), "dedup.db"), clock.Now)
	defer st.Destruct()
	s, ctx := &Store{state: st}, context.Background()
	const events = 50
	for i := range events {
		key := fmt.Sprintf("evt_%d", i)
		if res, _, err := s.Claim(ctx, key, "tok", time.Minute); err != nil || res != dedup.Claimed {
			t.Fatalf("claim %s = %v, %v", key, res, err)
		}
		if _, err := s.Commit(ctx, key, "tok", dedup.DoneRecord{ProcessedAt: clock.Now()}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if n := tableDeletions(t, st); n != 0 {
		t.Fatalf("%d deletions in the tables after %d events claimed and committed; want none", n, events)
	}
	if keys := leasesOnDisk(t, st); len(keys) != 0 {
		t.Fatalf("leases on disk after the commits: %q", keys)
	}
	for i := range events {
		if _, done, err := st.read(fmt.Sprintf("evt_%d", i)); err != nil || !done {
			t.Fatalf("evt_%d: done = %v, %v; want its record", i, done, err)
		}
	}
	noMisuse(t, logs)
}

// A lease with two writes behind it (renewed, taken over from a mark,
// or taken back at the store's start) is deleted with a Delete at its
// commit: a SingleDelete would delete its last write only, and the
// earlier one would come back, after the flush and the compactions.
func TestFileStoreLeaseWrittenTwiceIsDeletedForGood(t *testing.T) {
	clock := testclock.New()
	clock.Advance(time.Since(clock.Now()))
	path := filepath.Join(t.TempDir(), "dedup.db")
	st, _ := openObserved(t, path, clock.Now)
	s, ctx := &Store{state: st}, context.Background()
	claim := func(key, token string, ttl time.Duration, want dedup.ClaimResult) {
		t.Helper()
		if res, _, err := s.Claim(ctx, key, token, ttl); err != nil || res != want {
			t.Fatalf("claim %s by %s = %v, %v; want %v", key, token, res, err, want)
		}
	}
	commit := func(key, token string) {
		t.Helper()
		if _, err := s.Commit(ctx, key, token, dedup.DoneRecord{ProcessedAt: clock.Now()}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	// Written twice before a restart, the first write in a table of its
	// own (else a flush keeps the last one only), committed after it.
	claim("restarted", "t1", time.Hour, dedup.Claimed)
	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Renew(ctx, "restarted", "t1", time.Hour); err != nil || !ok {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	st, logs := openObserved(t, path, clock.Now)
	defer st.Destruct()
	s = &Store{state: st}
	commit("restarted", "t1")

	claim("renewed", "t1", time.Minute, dedup.Claimed)
	if ok, err := s.Renew(ctx, "renewed", "t1", time.Minute); err != nil || !ok {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	commit("renewed", "t1")

	claim("reclaimed", "t1", time.Second, dedup.Claimed)
	clock.Advance(2 * time.Second)
	claim("reclaimed", "t2", time.Minute, dedup.Reclaimed)
	commit("reclaimed", "t2")

	if err := st.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if keys := leasesOnDisk(t, st); len(keys) != 0 {
		t.Fatalf("leases back on disk after the flush: %q", keys)
	}
	if err := st.db.Compact(ctx, []byte{prefixLease}, []byte{prefixLease + 1}, false); err != nil {
		t.Fatal(err)
	}
	if keys := leasesOnDisk(t, st); len(keys) != 0 {
		t.Fatalf("leases back on disk after a compaction: %q", keys)
	}
	noMisuse(t, logs)
}

// A lease written again while its commit's batch is on its way (a
// renewal racing the commit: the handler does not, the Store's contract
// allows it), before or after the commit's write is in the batch, is not
// left on disk behind the commit's deletion: that write follows the
// deletion, so dropping the lease from memory puts a deletion of it in
// the journal too. So with a release and a claim of the same token
// (which leaves a lease written once: a SingleDelete before it would
// annul the earlier write, and leave it). Claimed again later, the key
// is deleted for good.
func TestFileStoreLeaseRenewedDuringItsCommit(t *testing.T) {
	for _, window := range []string{"before its write", "after its write", "released and claimed again, before its write"} {
		t.Run(window, func(t *testing.T) {
			clock := testclock.New()
			clock.Advance(time.Since(clock.Now()))
			st, logs := openObserved(t, filepath.Join(t.TempDir(), "dedup.db"), clock.Now)
			defer st.Destruct()
			s, ctx := &Store{state: st}, context.Background()
			if res, _, err := s.Claim(ctx, "k", "t1", time.Minute); err != nil || res != dedup.Claimed {
				t.Fatalf("claim = %v, %v", res, err)
			}
			renewed := make(chan error, 1)
			var once sync.Once
			// In the writer, in the commit's batch: the renewal queues its
			// write, and waits for the next batch.
			renew := func(ops []*fileOp) {
				if !slices.ContainsFunc(ops, func(op *fileOp) bool { return op.lands == "k" }) {
					return
				}
				once.Do(func() {
					go func() {
						if window == "released and claimed again, before its write" {
							if ok, err := s.Release(ctx, "k", "t1"); err != nil || !ok {
								renewed <- fmt.Errorf("release = %v, %v", ok, err)
								return
							}
							_, _, err := s.Claim(ctx, "k", "t1", time.Minute)
							renewed <- err
							return
						}
						_, err := s.Renew(ctx, "k", "t1", time.Minute)
						renewed <- err
					}()
					for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
						if _, leased := st.leases.Lookup("k"); leased && st.lq.pending("k") {
							return // the renewal's, or the new claim's, write queued
						}
					}
					t.Error("the renewal (or claim) queued no write within 3 s")
				})
			}
			if window != "after its write" {
				st.leasesTakenHook.Store(&renew)
			} else {
				hook := beforeCommitHook(func(ops []*fileOp, _ int) error { renew(ops); return nil })
				st.beforeCommitHook.Store(&hook)
			}
			if _, err := s.Commit(ctx, "k", "t1", dedup.DoneRecord{ProcessedAt: clock.Now()}, time.Hour); err != nil {
				t.Fatal(err)
			}
			st.leasesTakenHook.Store(nil)
			st.beforeCommitHook.Store(nil)
			if err := <-renewed; err != nil {
				t.Fatal(err)
			}
			if err := st.syncLeases(); err != nil {
				t.Fatal(err)
			}
			if keys := leasesOnDisk(t, st); len(keys) != 0 {
				t.Fatalf("leases on disk after the commit and the renewal: %q", keys)
			}
			// The record goes (forgotten), and the key is claimed and
			// committed again: nothing of either lease comes back.
			if _, _, err := s.Forget(ctx, "k", false); err != nil {
				t.Fatal(err)
			}
			if res, _, err := s.Claim(ctx, "k", "t2", time.Minute); err != nil || res != dedup.Claimed {
				t.Fatalf("claim after the forget = %v, %v", res, err)
			}
			if _, err := s.Commit(ctx, "k", "t2", dedup.DoneRecord{ProcessedAt: clock.Now()}, time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := st.db.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := st.db.Compact(ctx, []byte{prefixLease}, []byte{prefixLease + 1}, false); err != nil {
				t.Fatal(err)
			}
			if keys := leasesOnDisk(t, st); len(keys) != 0 {
				t.Fatalf("leases back on disk: %q", keys)
			}
			noMisuse(t, logs)
		})
	}
}

// openStallable opens a store at a new path on a test clock set to now,
// not closed at the test's end (st.Destruct stands for a crash), with a
// write timeout short enough for holdWriter to stall a claim.
func openStallable(t *testing.T) (*testclock.Clock, string, *shared) {
	t.Helper()
	old := fileWriteTimeout
	t.Cleanup(func() { fileWriteTimeout = old })
	fileWriteTimeout = 300 * time.Millisecond
	clock := testclock.New()
	clock.Advance(time.Since(clock.Now()))
	path := filepath.Join(t.TempDir(), "dedup.db")
	return clock, path, openUnclosed(t, path, clock.Now)
}

// A claim over a mark (Reclaimed) whose lease cannot be made durable
// (the disk stalled past fileWriteTimeout) fails, and puts the mark
// back: the earlier attempt's fate is still unknown, so the next
// delivery must still be marked, now and after a restart. (It was
// released, mark and all: the next delivery went to the backend
// unmarked.)
func TestFileStoreFailedReclaimKeepsTheMark(t *testing.T) {
	clock, path, st := openStallable(t)
	s, ctx := &Store{state: st}, context.Background()
	if res, _, err := s.Claim(ctx, "k", "T", time.Second); err != nil || res != dedup.Claimed {
		t.Fatalf("T's claim: %v %v", res, err)
	}
	clock.Advance(2 * time.Second) // T's lease ran out: a mark
	if e, _ := s.Get(ctx, "k"); e.State() != "unknown" {
		t.Fatalf("before: %q, want unknown", e.State())
	}
	stalled, release := holdWriter(st)
	<-stalled
	if res, _, err := s.Claim(ctx, "k", "U", time.Minute); !errors.Is(err, errFileStalled) {
		t.Fatalf("U's claim on a stalled disk: %v %v, want the stall", res, err)
	}
	release()
	if err := Sync(s); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "k"); e.State() != "unknown" || !dedup.IsLease(e.Value, "T") {
		t.Errorf("after U's failed claim: %q %q, want T's mark", e.State(), e.Value)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	s = &Store{state: openTestShared(t, path, clock.Now)}
	if res, found, err := s.Claim(ctx, "k", "V", time.Minute); err != nil || res != dedup.Reclaimed || !dedup.IsLease(found, "T") {
		t.Errorf("V's claim after a restart: %v %q %v, want Reclaimed over T's mark", res, found, err)
	}
}

// TestFileStoreFailedRetriedClaimKeepsTheLease: a claim retried with the
// same token writes its lease again (it lives ttl again). If that write
// does not become durable (the disk stalls past fileWriteTimeout), the
// claim fails and the lease stays the token's (its expiry the retry's,
// or the first's if that write never lands): the first claim holds it
// still. Releasing it, as a failed first claim is, let
// another token claim the key (a review: the signature binding, the one
// caller that claims twice with one token, lost its record on a stall).
func TestFileStoreFailedRetriedClaimKeepsTheLease(t *testing.T) {
	clock, path, st := openStallable(t)
	s, ctx := &Store{state: st}, context.Background()
	if res, _, err := s.Claim(ctx, "k", "T", time.Minute); err != nil || res != dedup.Claimed {
		t.Fatalf("T's claim: %v %v", res, err)
	}
	stalled, release := holdWriter(st)
	<-stalled
	if res, _, err := s.Claim(ctx, "k", "T", 2*time.Minute); !errors.Is(err, errFileStalled) {
		t.Fatalf("T's retried claim on a stalled disk: %v %v, want the stall", res, err)
	}
	release()
	if err := Sync(s); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get(ctx, "k"); e.State() != "in_flight" || !dedup.IsLease(e.Value, "T") {
		t.Errorf("after T's failed retry: %q %q, want T's lease", e.State(), e.Value)
	}
	if res, _, err := s.Claim(ctx, "k", "U", time.Minute); err != nil || res != dedup.InFlight {
		t.Errorf("U's claim after T's failed retry: %v %v, want in flight (T's lease)", res, err)
	}
	if err := st.Destruct(); err != nil {
		t.Fatal(err)
	}
	s = &Store{state: openTestShared(t, path, clock.Now)}
	if e, _ := s.Get(ctx, "k"); e.State() != "in_flight" || !dedup.IsLease(e.Value, "T") {
		t.Errorf("after a restart: %q %q, want T's lease", e.State(), e.Value)
	}
}
