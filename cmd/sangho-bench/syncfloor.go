package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// syncFloor (the sync floor) is the least any durable store does for a
// new ID's claim: the lease written to a log and fdatasync'ed before
// the claim returns, the claims that arrive together sharing one write
// and one sync (a group commit, as the file store's writer and Pebble's
// log writer do).
// The log is written beforehand and then overwritten in a ring, so a
// sync flushes data only, neither the file's size nor its extents (as
// a log that Pebble recycles). Paced beside the store's claims, it
// tells what of their latency the disk takes, whatever the store.
type syncFloor struct {
	f     *os.File
	off   int64
	ops   chan *floorOp
	done  chan struct{}
	syncs int // group commits made (read after close)
	// sync syncs the log's file descriptor: unix.Fdatasync (a test
	// watches it).
	sync func(fd int) error
}

// syncFloorSize is the floor's log: at 1,000 claims a second of some 30
// bytes each, two minutes before it wraps.
const syncFloorSize = 4 << 20

type floorOp struct {
	b   []byte
	err chan error
}

// openSyncFloor creates the log at path (truncated) and starts its
// writer.
func openSyncFloor(path string) (*syncFloor, error) {
	s, err := newSyncFloor(path)
	if err == nil {
		go s.write()
	}
	return s, err
}

// newSyncFloor creates the log at path, written and synced whole; its
// writer is not started.
func newSyncFloor(path string) (*syncFloor, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(make([]byte, syncFloorSize)); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return &syncFloor{f: f, ops: make(chan *floorOp, 4096), done: make(chan struct{}), sync: unix.Fdatasync}, nil
}

func (s *syncFloor) write() {
	defer close(s.done)
	var batch []*floorOp
	var buf []byte
	for op := range s.ops {
		batch, buf = append(batch[:0], op), append(buf[:0], op.b...)
	more:
		for {
			select {
			case op, ok := <-s.ops:
				if !ok {
					break more
				}
				batch, buf = append(batch, op), append(buf, op.b...)
			default:
				break more
			}
		}
		// (a batch is at most 4,096 claims of a few dozen bytes: far
		// less than the log, which it never grows)
		if s.off+int64(len(buf)) > syncFloorSize {
			s.off = 0
		}
		_, err := s.f.WriteAt(buf, s.off)
		s.off += int64(len(buf))
		if err == nil {
			err = s.sync(int(s.f.Fd()))
		}
		s.syncs++
		for _, o := range batch {
			o.err <- err
		}
	}
}

// claim returns once b is written and synced.
func (s *syncFloor) claim(b []byte) error {
	op := &floorOp{b: b, err: make(chan error, 1)}
	s.ops <- op
	return <-op.err
}

// close stops the writer (no claim may be running) and closes the log.
func (s *syncFloor) close() error {
	close(s.ops)
	<-s.done
	return s.f.Close()
}

// syncFloorClaims paces claims on the sync floor whose log is a new
// file in dir (removed after) as runClaims does, rate a second for dur.
func syncFloorClaims(dir string, dur time.Duration, rate float64) (claimLats, error) {
	f, err := os.CreateTemp(dir, "sangho-bench-floor-*.log")
	if err != nil {
		return claimLats{}, err
	}
	path := f.Name()
	_ = f.Close()
	defer os.Remove(path)
	s, err := openSyncFloor(path)
	if err != nil {
		return claimLats{}, err
	}
	var n atomic.Uint64
	lat, err := runClaims(dur, rate, func(g int, _ *rand.Rand) error {
		return s.claim(fmt.Appendf(nil, "%020d lease t%d\n", n.Add(1), g))
	})
	if cerr := s.close(); err == nil {
		err = cerr
	}
	return lat, err
}
