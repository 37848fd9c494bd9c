package main

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

// The file store at the seed's scale (-filescale fill|measure): a store
// of N live records after 108 simulated hours of a steady load kept 72
// hours (so 36 hours of expiry and sweeping behind it), then, in a fresh
// process, what a start costs and what the store answers at that size.
const (
	scaleHours     = 108 * time.Hour
	scaleRetention = 72 * time.Hour
)

// fileScaleFill fills the store at path (bench only: a bulk loader, not
// claims; see filestore.BenchFill) and prints its size.
func fileScaleFill(path string, live int) error {
	start := time.Now()
	err := filestore.BenchFill(path, live, start, scaleHours, scaleRetention, func(phase string, written, deleted int) {
		fmt.Fprintf(os.Stderr, "\rfill: %s: %d written, %d deleted, %.0f s    ", phase, written, deleted, time.Since(start).Seconds())
	})
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return err
	}
	bytes, files := dirSize(filestore.StoreDir(path))
	fmt.Printf("filled %s: %d live records (%d written over %v, each kept %v) in %.1f s; %.1f MiB in %d files, %.1f B/live record\n",
		filestore.StoreDir(path), live, int(float64(live)*float64(scaleHours)/float64(scaleRetention)), scaleHours, scaleRetention,
		time.Since(start).Seconds(), float64(bytes)/(1<<20), files, float64(bytes)/float64(live))
	return nil
}

// fileScaleMeasure opens the store at path (filled by fileScaleFill)
// in this fresh process, its files evicted from the page cache first
// unless warm, on a clock that starts where the fill's load ended, and
// measures: the open and the first claims; memory; claim latency for
// existing and new IDs at 32 goroutines; the durable commit rate
// without and with the sweeper deleting 100 expired records a second;
// the size on disk once closed.
func fileScaleMeasure(path string, warm bool, dur time.Duration) error {
	dir := filestore.StoreDir(path)
	end, live, err := filestore.BenchFillEnd(path)
	if err != nil {
		return err
	}
	// Whatever the page cache still holds to write (a copy of the store
	// made just before, say) is written now, not during the runs, where
	// the syncs of every claim would wait behind it.
	t0 := time.Now()
	if err := syncFS(dir); err != nil {
		return err
	}
	fmt.Printf("synced the file system of %s first: %v\n", dir, time.Since(t0).Round(time.Millisecond))
	if !warm {
		n, err := evict(dir)
		if err != nil {
			return err
		}
		cached, pages := residentPages(dir)
		fmt.Printf("evicted %d files of %s from the page cache (posix_fadvise DONTNEED; mincore: %d of %d pages resident after)\n", n, dir, cached, pages)
	}
	first, total := filestore.BenchLive(live, scaleHours, scaleRetention)
	// the oldest tenth expire during the run (the sweep phase's clock
	// jumps): the existing IDs are drawn from the rest
	first += live / 10
	// The clock: from the end of the fill's load on, at real speed, until
	// the sweep phase runs it faster so that the fill's records expire at
	// 100 a second (live/72 h is the rate they expire at in real time:
	// 100/s at 26 M).
	var offset, speedFrom atomic.Int64
	speed := 100 / (float64(live) / scaleRetention.Seconds())
	now := func() time.Time {
		t := time.Now()
		if from := speedFrom.Load(); from != 0 {
			t = t.Add(time.Duration(float64(t.UnixNano()-from) * (speed - 1)))
		}
		return t.Add(time.Duration(offset.Load()))
	}
	offset.Store(end.UnixNano() - time.Now().UnixNano())
	cache := filestore.BenchCacheSize(int64(fileScaleCacheMiB) << 20)
	fmt.Printf("block cache %d MiB\n", cache>>20)
	ctx := context.Background()
	t0 = time.Now()
	s, err := filestore.OpenForBench(path, now, time.Hour)
	if err != nil {
		return err
	}
	open := time.Since(t0)
	res, _, err := s.Claim(ctx, filestore.BenchKey(uint64(total-1)), "t", time.Minute)
	if err != nil || res != dedup.AlreadyDone {
		return fmt.Errorf("first claim of a live record: %v %v", res, err)
	}
	firstClaim := time.Since(t0)
	t1 := time.Now()
	if res, _, err := s.Claim(ctx, filestore.BenchKey(1<<40), "t", time.Minute); err != nil || res != dedup.Claimed {
		return fmt.Errorf("first claim of a new ID: %v %v", res, err)
	}
	_, _ = s.Release(ctx, filestore.BenchKey(1<<40), "t")
	newClaim := time.Since(t1)
	rss, hwm := memKB(os.Getpid())
	fmt.Printf("open %v; + first claim (a live record) %v; then a new ID's claim %v; RSS after %.0f MiB (peak %.0f MiB)\n",
		open.Round(time.Millisecond), firstClaim.Round(time.Millisecond), newClaim.Round(time.Microsecond), float64(rss)/1024, float64(hwm)/1024)
	if tables, index, filter, err := s.BenchTables(); err == nil {
		fmt.Printf("%d tables; their index blocks %.1f MiB, filter blocks %.1f MiB (the block cache holds them and the data blocks read)\n",
			tables, float64(index)/(1<<20), float64(filter)/(1<<20))
	}

	// claim latency, 32 goroutines, dur each
	// new IDs: numbers no fill wrote nor an earlier run (the runs commit
	// theirs)
	var nextNew atomic.Uint64
	nextNew.Store(uint64(time.Now().UnixNano()))
	claimLat := func(existing bool, rate float64) (claimLats, error) {
		return runClaims(dur, rate, func(g int, r *rand.Rand) error {
			var key string
			if existing {
				key = filestore.BenchKey(uint64(first + r.IntN(total-first)))
			} else {
				key = filestore.BenchKey(nextNew.Add(1))
			}
			tok := fmt.Sprint("t", g)
			res, _, err := s.Claim(ctx, key, tok, time.Minute)
			if err != nil || (existing && res != dedup.AlreadyDone) || (!existing && res != dedup.Claimed) {
				return fmt.Errorf("claim %s (existing %v): %v %v", key, existing, res, err)
			}
			if !existing {
				_, _ = s.Release(ctx, key, tok)
			}
			return nil
		})
	}
	rates := []float64{0}
	if fileScaleClaimRate > 0 {
		rates = append(rates, fileScaleClaimRate)
		if fileScalePacedFirst {
			rates = []float64{fileScaleClaimRate, 0}
		}
	}
	// At a rate, the sync floor beside the store's claims (see syncFloor).
	floor := func(rate float64, when string) error {
		lat, err := syncFloorClaims(filepath.Dir(dir), dur, rate)
		if err != nil {
			return err
		}
		fmt.Printf("the sync floor (a claim that writes its lease to a log beside the store and fdatasyncs it, by group commit), %s, the same: %s\n", when, lat.describe(dur, true))
		return nil
	}
	for _, rate := range rates {
		if rate > 0 {
			// The generator's own lateness at this rate, beside the store's.
			lat, err := runClaims(dur, rate, func(int, *rand.Rand) error { return nil })
			if err != nil {
				return err
			}
			fmt.Printf("the generator alone (a claim that does nothing), 32 goroutines at %.0f claims/s in all, %v: %s\n", rate, dur, lat.describe(dur, true))
			if err := floor(rate, "before the store's claims"); err != nil {
				return err
			}
		}
		for _, existing := range []bool{true, false} {
			lat, err := claimLat(existing, rate)
			if err != nil {
				return err
			}
			if len(lat.fromDue) == 0 {
				return fmt.Errorf("no claim ran in %v", dur)
			}
			what := "new IDs"
			if existing {
				what = "existing IDs (duplicates)"
			}
			how := "32 goroutines"
			if rate > 0 {
				how = fmt.Sprintf("32 goroutines at %.0f claims/s in all", rate)
			}
			fmt.Printf("claim, %s, %s, %v: %s\n", what, how, dur, lat.describe(dur, rate > 0))
		}
		if rate > 0 {
			if err := floor(rate, "after them"); err != nil {
				return err
			}
		}
	}
	rss, hwm = memKB(os.Getpid())
	fmt.Printf("RSS after the claim runs %.0f MiB (peak %.0f MiB): %s\n", float64(rss)/1024, float64(hwm)/1024, s.BenchMemory())

	// Durable commits, 32 goroutines, without and with the sweeper: at
	// least 35 s each, so that the sweeper ticks (every 10 s) three
	// times.
	sweepDur := max(dur, 3*filestore.BenchSweepEvery+filestore.BenchSweepEvery/2)
	var committed atomic.Int64
	commits := func(sweep bool) (float64, sweepStats, error) {
		var n atomic.Int64
		var failed atomic.Value
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var stats sweepStats
		sweepWait := func() error { return nil }
		if sweep {
			sweepWait = tickUntil(filestore.BenchSweepEvery, stop, func() error {
				r, d, err := s.BenchSweepTick()
				stats.ticks, stats.read, stats.deleted = stats.ticks+1, stats.read+r, stats.deleted+d
				return err
			})
		}
		end := time.Now().Add(sweepDur)
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					key := filestore.BenchKey(nextNew.Add(1))
					tok := fmt.Sprint("c", g)
					if _, _, err := s.Claim(ctx, key, tok, time.Minute); err != nil {
						failed.Store(err)
						return
					}
					if _, err := s.Commit(ctx, key, tok, filestore.BenchRecord(key, now()), scaleRetention); err != nil {
						failed.Store(err)
						return
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		close(stop)
		sweepErr := sweepWait()
		committed.Add(n.Load())
		if err, _ := failed.Load().(error); err != nil {
			return 0, stats, err
		}
		return float64(n.Load()) / sweepDur.Seconds(), stats, sweepErr
	}
	base, _, err := commits(false)
	if err != nil {
		return err
	}
	// The records that expired since the fill's end: swept first,
	// untimed. Then the clock jumps by the time the sweeper takes for a
	// whole pass (at the sped-up rate): as many expired records wait
	// for it, spread over the keys, as in a store whose sweeper has
	// run all along, and it runs faster, so that 100 records expire a
	// second.
	backlog, err := s.BenchSweepAll()
	if err != nil {
		return err
	}
	pass := filestore.BenchSweepPass(live)
	offset.Add(int64(float64(pass) * speed))
	speedFrom.Store(time.Now().UnixNano())
	withSweep, stats, err := commits(true)
	if err != nil {
		return err
	}
	speedFrom.Store(0)
	base2, _, err := commits(false)
	if err != nil {
		return err
	}
	fmt.Printf("durable commits (claim + commit of new IDs), 32 goroutines, %v each: %.0f/s; with the sweeper (%d ticks, %.0f records read/s, %.0f expired records deleted/s): %.0f/s; without again: %.0f/s (%.2fx slower than the mean of the two); backlog swept first: %d; a whole pass takes %v\n",
		sweepDur, base, stats.ticks, float64(stats.read)/sweepDur.Seconds(), float64(stats.deleted)/sweepDur.Seconds(), withSweep, base2, (base+base2)/2/withSweep, backlog, pass)
	if fileScaleBacklog > 0 {
		if _, err := backlogRuns(s, &offset, sweepDur, filestore.BenchSweepEvery, func() uint64 { return nextNew.Add(1) }, now, &committed); err != nil {
			return err
		}
	}
	rss, hwm = memKB(os.Getpid())
	fmt.Printf("RSS at the end %.0f MiB (peak %.0f MiB): %s\n", float64(rss)/1024, float64(hwm)/1024, s.BenchMemory())
	if err := s.BenchClose(); err != nil {
		return err
	}
	bytes, files := dirSize(dir)
	// the commit runs added records (new IDs, kept 72 h)
	now1 := live + int(committed.Load())
	fmt.Printf("on disk once closed: %.1f MiB in %d files, %.1f B/live record (%d live: the fill's and the %d the commit runs added)\n",
		float64(bytes)/(1<<20), files, float64(bytes)/float64(now1), now1, committed.Load())
	return nil
}

// syncFS writes to disk whatever the page cache holds to write on the
// file system of dir (syncfs(2)).
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// evict drops every file of dir from the page cache.
func evict(dir string) (int, error) {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_ = f.Sync()
		n++
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
	return n, err
}

// residentPages is how many of the pages of dir's files are in the page
// cache (mincore), and how many pages they have.
func residentPages(dir string) (resident, pages int) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return nil
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil || fi.Size() == 0 {
			return nil
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return nil
		}
		defer unix.Munmap(m)
		vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e == 0 {
			for _, v := range vec {
				resident += int(v & 1)
			}
			pages += len(vec)
		}
		return nil
	})
	return resident, pages
}

// dirSize is the bytes and the number of the files in dir.
func dirSize(dir string) (int64, int) {
	var bytes int64
	files := 0
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				bytes += fi.Size()
				files++
			}
		}
		return nil
	})
	return bytes, files
}

// fileScaleCacheMiB is -filescale-cache-mib.
var fileScaleCacheMiB int

// fileScaleClaimRate is -filescale-claim-rate.
var fileScaleClaimRate float64

// fileScalePacedFirst is -filescale-paced-first.
var fileScalePacedFirst bool

// fileScaleBacklog is -filescale-backlog.
var fileScaleBacklog time.Duration

// backlogRuns is -filescale measure's last part with -filescale-backlog:
// the clock jumps by that much, so that the records of that time wait
// for the sweeper, as after Caddy was stopped that long; then new IDs
// are claimed and committed from 32 goroutines for dur while the
// sweeper ticks every `every` (the store's own interval in measure),
// each tick deleting the expired records of its slice, many more than
// at the steady expiry, each claim timed (a claim waits for the
// writer, so it waits behind the sweep's batches); then the same for
// dur without the sweeper. It returns the two runs' figures, with the
// sweeper first.
func backlogRuns(s *filestore.Store, offset *atomic.Int64, dur, every time.Duration, next func() uint64, now func() time.Time, committed *atomic.Int64) ([]backlogRun, error) {
	offset.Add(int64(fileScaleBacklog))
	ctx := context.Background()
	run := func(sweep bool) (rate float64, lat []time.Duration, read, deleted int, err error) {
		stop := make(chan struct{})
		sweepWait := func() error { return nil }
		if sweep {
			sweepWait = tickUntil(every, stop, func() error {
				r, d, err := s.BenchSweepTick()
				read, deleted = read+r, deleted+d
				return err
			})
		}
		var mu sync.Mutex
		var failed atomic.Value
		var wg sync.WaitGroup
		end := time.Now().Add(dur)
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
				tok := fmt.Sprint("b", g)
				for time.Now().Before(end) {
					key := filestore.BenchKey(next())
					t0 := time.Now()
					if _, _, err := s.Claim(ctx, key, tok, time.Minute); err != nil {
						failed.Store(err)
						return
					}
					mine = append(mine, time.Since(t0))
					if _, err := s.Commit(ctx, key, tok, filestore.BenchRecord(key, now()), scaleRetention); err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		sweepErr := sweepWait()
		committed.Add(int64(len(lat)))
		if err, _ := failed.Load().(error); err != nil {
			return 0, nil, read, deleted, err
		}
		slices.Sort(lat)
		return float64(len(lat)) / dur.Seconds(), lat, read, deleted, sweepErr
	}
	var runs []backlogRun
	for _, sweep := range []bool{true, false} {
		rate, lat, read, deleted, err := run(sweep)
		if err != nil {
			return runs, err
		}
		runs = append(runs, backlogRun{claims: len(lat), deleted: deleted, p99: quantile(lat, 0.99)})
		what := "without the sweeper"
		if sweep {
			what = fmt.Sprintf("with the sweeper (a tick every %v: %d records read, %d deleted)", every, read, deleted)
		}
		fmt.Printf("backlog of %v (the clock jumped): claim + commit of new IDs, 32 goroutines, %v, %s: %.0f/s; claims p50 %v, p99 %v, p99.9 %v, max %v\n",
			fileScaleBacklog, dur, what, rate, quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999), quantile(lat, 1))
	}
	return runs, nil
}

// sweepStats is what the sweeper did during a run.
type sweepStats struct{ ticks, read, deleted int }

// tickUntil calls fn every `every`, in a goroutine of its own, until
// stop is closed or fn fails; wait waits for it to end and returns fn's
// error.
func tickUntil(every time.Duration, stop <-chan struct{}, fn func() error) (wait func() error) {
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				if err = fn(); err != nil {
					return
				}
			}
		}
	}()
	return func() error { <-done; return err }
}

// backlogRun is what one of backlogRuns' runs measured.
type backlogRun struct {
	claims, deleted int
	p99             time.Duration
}

// fileScaleServeConfig is what the flags give -filescale serve.
var fileScaleServeConfig serveConfig

// fileScaleMain runs -filescale.
func fileScaleMain(mode, path string, live int, warm bool, dur time.Duration) error {
	if path == "" {
		return fmt.Errorf("-filescale needs -filescale-path")
	}
	switch strings.ToLower(mode) {
	case "fill":
		if live <= 0 {
			return fmt.Errorf("-filescale fill needs -filescale-records")
		}
		return fileScaleFill(path, live)
	case "measure":
		return fileScaleMeasure(path, warm, dur)
	case "serve":
		cfg := fileScaleServeConfig
		if cfg.rate <= 0 || cfg.resend < 0 || cfg.resend > 1 || cfg.sample <= 0 {
			return fmt.Errorf("-filescale serve needs -filescale-rate > 0, -filescale-resend in 0..1 and -filescale-sample > 0")
		}
		rep, err := fileScaleServe(cfg)
		if err != nil {
			return err
		}
		fmt.Print(rep)
		return nil
	}
	return fmt.Errorf("-filescale must be fill, measure or serve, not %q", mode)
}

// claimLats are the latencies of a run of claims, each sorted.
type claimLats struct {
	// fromDue: from each claim's due time (at a rate), or from its
	// start (without one).
	fromDue []time.Duration
	// fromStart: at a rate, from the claim's start when its goroutine was
	// waiting for the due time (the time Go's timer took to wake it left
	// out, up to load.TimerSlack), and from its due time when the goroutine
	// was still busy with the claim before it (held up by the store:
	// counted).
	fromStart []time.Duration
}

// runClaims runs claim from 32 goroutines for dur and returns every
// claim's latency. rate 0: each goroutine claims as fast as it can (a
// closed loop: the latency includes waiting for a CPU behind the 31
// others). rate > 0: rate claims a second in all, rate/32 each, at due
// times spread evenly (an open loop): a claim held up delays the ones
// after it and they are counted, not hidden (no coordinated omission);
// see claimLats for the two ways they are counted.
func runClaims(dur time.Duration, rate float64, claim func(g int, r *rand.Rand) error) (claimLats, error) {
	var mu sync.Mutex
	var all claimLats
	var failed atomic.Value
	var wg sync.WaitGroup
	begin := time.Now()
	end := begin.Add(dur)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			var fromDue, fromStart []time.Duration
			var every time.Duration
			if rate > 0 {
				every = time.Duration(32 / rate * float64(time.Second))
			}
			start := begin.Add(time.Duration(g) * every / 32)
			prevEnd := begin
			for i := 0; ; i++ {
				due := time.Now()
				if rate > 0 {
					due = start.Add(time.Duration(i) * every)
					time.Sleep(time.Until(due))
				}
				if !due.Before(end) {
					break
				}
				began := claimStart(due, prevEnd, time.Now())
				err := claim(g, r)
				prevEnd = time.Now()
				fromDue, fromStart = append(fromDue, prevEnd.Sub(due)), append(fromStart, prevEnd.Sub(began))
				if err != nil {
					failed.Store(err)
					return
				}
			}
			mu.Lock()
			all.fromDue, all.fromStart = append(all.fromDue, fromDue...), append(all.fromStart, fromStart...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return claimLats{}, err
	}
	slices.Sort(all.fromDue)
	slices.Sort(all.fromStart)
	return all, nil
}

// describe gives the claims' number, rate and latency quantiles; paced:
// both ways (see claimLats).
func (l claimLats) describe(dur time.Duration, paced bool) string {
	q := func(lat []time.Duration) string {
		if len(lat) == 0 {
			return "no claim"
		}
		return fmt.Sprintf("p50 %v, p99 %v, p99.9 %v, max %v", quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999), quantile(lat, 1))
	}
	head := fmt.Sprintf("%d claims (%.0f/s), ", len(l.fromDue), float64(len(l.fromDue))/dur.Seconds())
	if !paced {
		return head + q(l.fromDue)
	}
	return head + "from each claim's due time " + q(l.fromDue) + "; from its start (the timer's lateness in waking an idle goroutine, up to " + load.TimerSlack.String() + ", left out) " + q(l.fromStart)
}

// quantile is the p quantile (0..1; 1: the largest) of the sorted lat,
// 0 if it is empty.
func quantile(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	return lat[min(len(lat)-1, int(float64(len(lat))*p))]
}

// claimStart is when a claim due at due starts to count, its goroutine
// having ended the claim before at prevEnd and woken (or gone on) at
// woke: the due time if the goroutine was still busy then (the claim
// waited for the store); else as load.PacedStart has it (the timer's
// lateness, up to load.TimerSlack, is the generator's, not the
// store's).
func claimStart(due, prevEnd, woke time.Time) time.Time {
	if prevEnd.After(due) {
		return due
	}
	return load.PacedStart(due, woke)
}
