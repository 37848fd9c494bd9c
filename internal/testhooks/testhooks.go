// Package testhooks lets the handler's tests (root package) bring about
// what only a store's internals can: a disk that does not complete a
// write. A store sets its hooks in init; nothing but tests calls them.
package testhooks

import (
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// The file store's hooks (package stores/file).
var (
	// FileWriteTimeout sets how long a file store write waits for the
	// disk before its caller gives up, and returns the restore.
	FileWriteTimeout func(d time.Duration) (restore func())
	// FileStall has the writer of s's file take a transaction that does
	// not complete (a stalled fsync) until release is called; stalled is
	// closed once the writer is held.
	FileStall func(s dedup.Store) (stalled <-chan struct{}, release func())
	// FileCounts returns the write transactions of s's file and the
	// writes they carried.
	FileCounts func(s dedup.Store) (txns, writes int64)
	// FileSync returns once every write queued before it is on disk.
	FileSync func(s dedup.Store) error
	// FileLease returns the lease s holds in memory for key.
	FileLease func(s dedup.Store, key string) (dedup.Entry, bool)
)

// T is what HoldInStalledWrite needs of a *testing.T.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// HoldInStalledWrite has the file's disk hold a write: it stalls the
// writer, calls start to begin the write (ready reports when it has),
// and stalls the next transaction with that write in it, so that the
// writer has taken the write but does not complete it. release lets the
// disk go on and returns once the held write is on disk.
func HoldInStalledWrite(t T, st dedup.Store, start func(), ready func() bool) (release func()) {
	t.Helper()
	stall := func() (<-chan struct{}, func()) { return FileStall(st) }
	txns, writes := FileCounts(st)
	stalled1, release1 := stall()
	<-stalled1
	start()
	for deadline := time.Now().Add(10 * time.Second); !ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the write did not start within 10s")
		}
	}
	time.Sleep(100 * time.Millisecond) // the write is waiting for the writer
	stalled2, release2 := stall()      // queued behind it
	time.Sleep(100 * time.Millisecond)
	release1()
	<-stalled2
	if n, w := FileCounts(st); n-txns != 2 || w-writes != 3 {
		t.Fatalf("setup: %d transactions, %d writes; want the write in the stalled second transaction", n, w)
	}
	return func() {
		release2()
		if err := FileSync(st); err != nil {
			t.Fatal(err)
		}
	}
}

// The Redis store's hooks (package stores/redis).
var (
	// RedisRecheckNow has s's next operation re-run the permission check
	// at once, instead of after its back-off.
	RedisRecheckNow func(s dedup.Store)
)
