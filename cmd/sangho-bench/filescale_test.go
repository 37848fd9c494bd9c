package main

import (
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

// At a rate, runClaims makes about rate × dur claims whatever a claim
// costs, and a claim held up is counted in the latency of the claims
// due behind it (open loop), not hidden by the goroutine falling behind.
func TestRunClaimsPaced(t *testing.T) {
	const rate, dur = 2000.0, 500 * time.Millisecond
	var first atomic.Bool
	lats, err := runClaims(dur, rate, func(g int, _ *rand.Rand) error {
		if g == 0 && first.CompareAndSwap(false, true) {
			time.Sleep(100 * time.Millisecond) // one claim held up
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := int(rate * dur.Seconds())
	if n := len(lats.fromDue); n < want-64 || n > want+64 || len(lats.fromStart) != n {
		t.Fatalf("%d claims (%d from their start) at %.0f/s for %v, want about %d", n, len(lats.fromStart), rate, dur, want)
	}
	// goroutine 0 claims every 16 ms: the held-up claim and the ~5
	// due behind it during its 100 ms each count ≥ 16 ms, both ways
	// (the goroutine was busy when they were due).
	for name, lat := range map[string][]time.Duration{"from the due time": lats.fromDue, "from the start": lats.fromStart} {
		slow := 0
		for _, l := range lat {
			if l >= 16*time.Millisecond {
				slow++
			}
		}
		if slow < 5 || lat[len(lat)-1] < 100*time.Millisecond {
			t.Fatalf("%s: %d claims ≥ 16 ms, max %v: the held-up claim and those due behind it must count (want ≥ 5, max ≥ 100 ms)", name, slow, lat[len(lat)-1])
		}
	}
}

// runClaims counts paced claims from their start too: with claims that
// take no time, the latencies from the start are each at most those
// from the due time and in all smaller (every goroutine wakes after its
// due time).
func TestRunClaimsFromStart(t *testing.T) {
	lats, err := runClaims(200*time.Millisecond, 2000, func(int, *rand.Rand) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var due, start time.Duration
	for i := range lats.fromDue {
		due, start = due+lats.fromDue[i], start+lats.fromStart[i]
	}
	if len(lats.fromStart) != len(lats.fromDue) || start >= due || lats.fromStart[len(lats.fromStart)-1] > lats.fromDue[len(lats.fromDue)-1] {
		t.Fatalf("%d claims: %v in all from their start, %v from their due time (max %v, %v); want less from the start",
			len(lats.fromDue), start, due, lats.fromStart[len(lats.fromStart)-1], lats.fromDue[len(lats.fromDue)-1])
	}
}

// A claim counts from its due time when its goroutine was still busy
// with the claim before (the store held it up), and from when the
// goroutine woke when it was waiting for the due time (the timer's
// lateness is the generator's, not the store's), but never from later
// than the timer's granularity after the due time (a CPU held longer
// counts).
func TestClaimStart(t *testing.T) {
	due := time.Unix(1000, 0)
	for _, c := range []struct {
		name          string
		prevEnd, woke time.Time
		want          time.Time
	}{
		{"idle, woken late by the timer", due.Add(-5 * time.Millisecond), due.Add(900 * time.Microsecond), due.Add(900 * time.Microsecond)},
		{"idle, woken later than the timer's granularity", due.Add(-5 * time.Millisecond), due.Add(5 * time.Millisecond), due.Add(load.TimerSlack)},
		{"idle, woken on time", due.Add(-5 * time.Millisecond), due, due},
		{"the claim before ended at the due time", due, due.Add(time.Millisecond), due.Add(time.Millisecond)},
		{"busy past the due time", due.Add(3 * time.Millisecond), due.Add(3 * time.Millisecond), due},
	} {
		if got := claimStart(due, c.prevEnd, c.woke); !got.Equal(c.want) {
			t.Errorf("%s: starts at due%+v, want due%+v", c.name, got.Sub(due), c.want.Sub(due))
		}
	}
}

// Without a rate the 32 goroutines claim as fast as they can.
func TestRunClaimsClosedLoop(t *testing.T) {
	lats, err := runClaims(100*time.Millisecond, 0, func(int, *rand.Rand) error {
		time.Sleep(time.Millisecond)
		return nil
	})
	lat := lats.fromDue
	if err != nil {
		t.Fatal(err)
	}
	// 32 goroutines, 1 ms a claim, 100 ms: about 3,200; paced at any
	// rate it would be far fewer.
	if len(lat) < 1000 {
		t.Fatalf("%d claims in a closed loop of 32 goroutines × 100 ms of 1 ms claims", len(lat))
	}
}

// The backlog runs on a real filled store: the clock's jump leaves
// expired records that the run with the sweeper deletes while its
// claims and commits go on (each claim timed and its record written),
// and the run without it deletes none.
func TestBacklogRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dedup.db")
	const live = 20000
	if err := filestore.BenchFill(path, live, time.Now(), scaleHours, scaleRetention, func(string, int, int) {}); err != nil {
		t.Fatal(err)
	}
	var offset atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	s, err := filestore.OpenForBench(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer s.BenchClose()
	fileScaleBacklog = 24 * time.Hour // a third of the records
	defer func() { fileScaleBacklog = 0 }()
	var next atomic.Uint64
	next.Store(1 << 40)
	var committed atomic.Int64
	runs, err := backlogRuns(s, &offset, 500*time.Millisecond, 50*time.Millisecond, func() uint64 { return next.Add(1) }, now, &committed)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 {
		t.Fatalf("%d runs; want 2 (with the sweeper, then without)", len(runs))
	}
	with, without := runs[0], runs[1]
	if with.deleted < live/4 || without.deleted != 0 {
		t.Errorf("deleted %d with the sweeper, %d without; want at least %d (a 24 h jump of 72 h), then none", with.deleted, without.deleted, live/4)
	}
	if with.claims == 0 || without.claims == 0 || committed.Load() != int64(with.claims+without.claims) {
		t.Errorf("claims %d and %d, commits counted %d: want claims in both runs, each committed", with.claims, without.claims, committed.Load())
	}
}
