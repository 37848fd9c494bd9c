package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A claim on the sync floor returns only once a sync made after its
// lease was written has ended, from 32 goroutines at once: the sync
// records what the log held when it synced, and each claim's lease
// must be in what was synced when the claim returns.
func TestSyncFloorClaimReturnsOnceItsLeaseIsSynced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "floor.log")
	s, err := newSyncFloor(path)
	if err != nil {
		t.Fatal(err)
	}
	var synced atomic.Pointer[[]byte] // the log as the last sync found it
	var syncs atomic.Int64
	s.sync = func(fd int) error {
		head, err := readHead(path, 64<<10) // the test writes less
		if err != nil {
			return err
		}
		if err := unix.Fdatasync(fd); err != nil {
			return err
		}
		syncs.Add(1)
		synced.Store(&head)
		return nil
	}
	go s.write()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				line := fmt.Appendf(nil, "lease %d-%d\n", g, i)
				if err := s.claim(line); err != nil {
					errs <- err
					return
				}
				if head := synced.Load(); head == nil || !bytes.Contains(*head, line) {
					errs <- fmt.Errorf("claim %q returned before a sync of it", line)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if b, _ := readHead(path, 64<<10); bytes.Count(b, []byte("\n")) != 32*20 {
		t.Errorf("%d leases in the log, want %d", bytes.Count(b, []byte("\n")), 32*20)
	}
	if n := syncs.Load(); n != int64(s.syncs) || n < 1 || n > 32*20 {
		t.Errorf("%d syncs seen, %d counted, for %d claims", n, s.syncs, 32*20)
	}
}

// Claims waiting together share one write and one sync (group commit).
func TestSyncFloorGroupCommits(t *testing.T) {
	s, err := newSyncFloor(filepath.Join(t.TempDir(), "floor.log"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.claim(fmt.Appendf(nil, "lease %d\n", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	for deadline := time.Now().Add(5 * time.Second); len(s.ops) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d claims queued after 5 s", len(s.ops), n)
		}
	}
	go s.write()
	wg.Wait()
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if s.syncs != 1 {
		t.Fatalf("%d claims waiting together took %d syncs, want 1", n, s.syncs)
	}
}

// syncFloorClaims paces claims on the floor at the rate and leaves no
// log behind.
func TestSyncFloorClaimsPacedAndRemoved(t *testing.T) {
	dir := t.TempDir()
	const rate, dur = 2000.0, 300 * time.Millisecond
	lat, err := syncFloorClaims(dir, dur, rate)
	if err != nil {
		t.Fatal(err)
	}
	if n, want := len(lat.fromDue), int(rate*dur.Seconds()); n < want-64 || n > want+64 {
		t.Errorf("%d claims at %.0f/s for %v, want about %d", n, rate, dur, want)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("%d files left in the folder, want none", len(left))
	}
}

// readHead reads the first n bytes of the file at path.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	n, err = f.ReadAt(b, 0)
	return b[:n], err
}

// The floor's log is overwritten in a ring: it never grows past its
// size (a sync flushes data only) and a claim past the end starts over
// at the front.
func TestSyncFloorLogIsARing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "floor.log")
	s, err := openSyncFloor(path)
	if err != nil {
		t.Fatal(err)
	}
	claim := bytes.Repeat([]byte{'x'}, 64<<10)
	for range syncFloorSize/len(claim) + 1 {
		if err := s.claim(claim); err != nil {
			t.Fatal(err)
		}
	}
	last := []byte("a claim after the wrap\n") // the 65th 64 KiB claim wrapped
	if err := s.claim(last); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != syncFloorSize {
		t.Fatalf("log of %v bytes (%v), want %d", fi.Size(), err, syncFloorSize)
	}
	if head, _ := readHead(path, 128<<10); !bytes.Contains(head, last) {
		t.Fatal("the claims past the log's end were not written at its front")
	}
}
