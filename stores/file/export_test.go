package file

import (
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

// Stall has the writer of s's file take a transaction that does not
// complete (a stalled fsync) until release is called; stalled is closed
// once the writer is held.
func Stall(s *Store) (stalled <-chan struct{}, release func()) {
	held, free := make(chan struct{}), make(chan struct{})
	go s.state.write(func(*txn) error { close(held); <-free; return nil })
	return held, func() { close(free) }
}

// Counts returns the write transactions of s's file and the writes they
// carried.
func Counts(s *Store) (txns, writes int64) { return s.state.txns.Load(), s.state.writes.Load() }

// Sync returns once every write queued before it is on disk.
func Sync(s *Store) error { return s.state.write(func(*txn) error { return nil }) }

// Lease returns the lease s's file holds in memory for key.
func Lease(s *Store, key string) (dedup.Entry, bool) { return s.state.leases.Lookup(key) }

// HoldInStalledWrite has the file's disk hold a write: it stalls the
// writer, calls start to begin the write (ready reports when it has),
// and stalls the next transaction with that write in it, so that the
// writer has taken the write but does not complete it. release lets the
// disk go on and returns once the held write is on disk.
func HoldInStalledWrite(t testing.TB, s *Store, start func(), ready func() bool) (release func()) {
	t.Helper()
	txns, writes := Counts(s)
	stalled1, release1 := Stall(s)
	<-stalled1
	start()
	for deadline := time.Now().Add(10 * time.Second); !ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the write did not start within 10s")
		}
	}
	time.Sleep(100 * time.Millisecond) // the write is waiting for the writer
	stalled2, release2 := Stall(s)     // queued behind it
	time.Sleep(100 * time.Millisecond)
	release1()
	<-stalled2
	if n, w := Counts(s); n-txns != 2 || w-writes != 3 {
		t.Fatalf("setup: %d transactions, %d writes; want the write in the stalled second transaction", n, w)
	}
	return func() {
		release2()
		if err := Sync(s); err != nil {
			t.Fatal(err)
		}
	}
}
