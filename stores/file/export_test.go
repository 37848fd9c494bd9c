package file

import (
	"sync"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// What the tests of package file_test (the store under the handler) need
// of this store's internals: a disk that does not complete a write. Each
// hook reaches the file s opened, which a handler provisioned on the same
// path shares (one open file per path in a process).

// SetWriteTimeout sets how long a write waits for the disk before its
// caller gives up, and returns the restore.
func SetWriteTimeout(d time.Duration) (restore func()) {
	old := fileWriteTimeout
	fileWriteTimeout = d
	return func() { fileWriteTimeout = old }
}

// Stall has s's disk stop answering at the next batch of the writer that
// carries a write (a commit, a forget, a sweep): that batch is not
// committed (a stalled fsync) until release is called; stalled is closed
// once the writer holds it. The batches before it, the claims' lease
// syncs among them, go on.
func Stall(s *Store) (stalled <-chan struct{}, release func()) {
	return stallWhen(s.state, func() bool { return true })
}

// stallWhen is Stall for the first such batch in which when() holds (as
// the writer runs it).
func stallWhen(st *shared, when func() bool) (stalled <-chan struct{}, release func()) {
	held, free := make(chan struct{}), make(chan struct{})
	var hold, done sync.Once
	hook := beforeCommitHook(func(ops []*fileOp, _ int) error {
		for _, op := range ops {
			if !op.sync && when() {
				hold.Do(func() { close(held); <-free })
				return nil
			}
		}
		return nil
	})
	st.beforeCommitHook.Store(&hook)
	return held, func() {
		done.Do(func() {
			st.beforeCommitHook.Store(nil)
			close(free)
		})
	}
}

// holdWriter has the writer take a write that does not complete until
// release: every write and lease sync after it waits (a disk that
// stopped answering before them); held is closed once the writer is held.
func holdWriter(st *shared) (held <-chan struct{}, release func()) {
	h, free := make(chan struct{}), make(chan struct{})
	go st.write(func(*txn) error { close(h); <-free; return nil })
	return h, func() { close(free) }
}

// Counts returns the write transactions of s's file and the writes they
// carried.
func Counts(s *Store) (txns, writes int64) { return s.state.txns.Load(), s.state.writes.Load() }

// Sync returns once every write queued before it is on disk.
func Sync(s *Store) error { return s.state.syncWrites() }

// Lease returns the lease s's file holds in memory for key.
func Lease(s *Store, key string) (dedup.Entry, bool) { return s.state.leases.Lookup(key) }

// HoldInStalledWrite has the file's disk hold a write: it stalls the
// next batch that carries a write once ready reports that the write has
// begun (Stall), calls start to begin it, and waits until the writer
// holds the batch with that write in it: the writer has taken the write
// but does not complete it. release lets the disk go on and returns once
// the held write is on disk.
func HoldInStalledWrite(t testing.TB, s *Store, start func(), ready func() bool) (release func()) {
	t.Helper()
	stalled, release1 := stallWhen(s.state, ready) // not a sweep's batch before the write
	t.Cleanup(release1)
	start()
	for deadline := time.Now().Add(10 * time.Second); !ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			release1()
			t.Fatalf("the write did not start within 10s")
		}
	}
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		release1()
		t.Fatalf("the write did not reach the writer within 10s")
	}
	return func() {
		release1()
		if err := Sync(s); err != nil {
			t.Fatal(err)
		}
	}
}
