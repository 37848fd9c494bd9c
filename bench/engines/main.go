package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var names = []string{"bbolt-today", "bbolt-tuned", "pebble", "badger"}

func open(name, dir string) (engine, error) {
	switch name {
	case "bbolt-today":
		return openBolt(dir, false)
	case "bbolt-tuned":
		return openBolt(dir, true)
	case "pebble":
		return openPebble(dir)
	case "badger":
		return openBadger(dir)
	}
	return nil, fmt.Errorf("unknown engine %s", name)
}

// done is a done record as the file store writes it (~120 bytes).
var done = []byte(`done:{"processed_at":"2025-01-01T00:00:00.000000000Z","event_type":"payment_intent.succeeded","status":200,"fp":"0123456789abcdef"}`)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// phase runs op from conc goroutines for d and returns ops/s and CPU
// µs per op.
func phase(conc int, d time.Duration, op func(g int, i int) error) (float64, float64, error) {
	var n atomic.Int64
	var failed atomic.Value
	stop := time.Now().Add(d)
	c0, t0 := cpuNow(), time.Now()
	var wg sync.WaitGroup
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				if err := op(g, i); err != nil {
					failed.Store(err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	el, cpu := time.Since(t0), cpuNow()-c0
	if err, _ := failed.Load().(error); err != nil {
		return 0, 0, err
	}
	return float64(n.Load()) / el.Seconds(), float64(cpu.Microseconds()) / float64(n.Load()), nil
}

type row struct {
	commit, claim, lookup          []float64 // ops/s per round
	commitCPU, claimCPU, lookupCPU []float64
	open, scan                     time.Duration
	size                           int64
	live                           int
	bin                            int64
}

func main() {
	dur := flag.Duration("duration", 3*time.Second, "length of each throughput phase")
	rounds := flag.Int("rounds", 2, "interleaved rounds of the throughput phases")
	conc := flag.Int("concurrency", 32, "goroutines")
	records := flag.Int("records", 1_000_000, "live records at the steady state (start-up and size)")
	dirFlag := flag.String("dir", "", "folder for the databases (default: a temporary one; put it on the disk the store would use)")
	only := flag.String("only", "", "comma-separated phases: speed,size,binary (default all)")
	engines := flag.String("engines", "", "comma-separated engines (default all: "+strings.Join(names, ",")+")")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *engines != "" {
		names = strings.Split(*engines, ",")
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	dir := *dirFlag
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "engines"); err != nil {
			fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	want := func(p string) bool { return *only == "" || slices.Contains(strings.Split(*only, ","), p) }
	rows := map[string]*row{}
	for _, n := range names {
		rows[n] = &row{}
	}
	if want("speed") {
		for r := range *rounds {
			order := slices.Clone(names)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			for _, name := range order {
				if err := speed(name, filepath.Join(dir, fmt.Sprintf("speed-%s-%d", name, r)), *conc, *dur, rows[name]); err != nil {
					fatal(fmt.Errorf("%s: %w", name, err))
				}
				fmt.Fprintf(os.Stderr, "round %d %-12s commit %6.0f/s (%5.1f µs CPU)  claim %6.0f/s (%5.1f µs)  lookup %8.0f/s (%5.1f µs)\n", r+1, name,
					last(rows[name].commit), last(rows[name].commitCPU), last(rows[name].claim), last(rows[name].claimCPU), last(rows[name].lookup), last(rows[name].lookupCPU))
			}
		}
	}
	if want("size") {
		for _, name := range names {
			if err := steady(name, filepath.Join(dir, "size-"+name), *records, rows[name]); err != nil {
				fatal(fmt.Errorf("%s: %w", name, err))
			}
			fmt.Fprintf(os.Stderr, "%-12s size %.1f MiB, live %d, open %v, open+scan %v\n", name, float64(rows[name].size)/(1<<20), rows[name].live, rows[name].open, rows[name].scan)
		}
	}
	if want("binary") {
		if err := binaries(dir, rows); err != nil {
			fatal(err)
		}
	}
	fmt.Print(table(rows, *conc, *dur, *rounds, *records, want))
}

func last(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "engines:", err)
	os.Exit(1)
}

// eventKey is the key of event i of goroutine g: random-looking, as
// senders' event IDs are, so that writes land all over the key space
// (a B+tree's worst case, and the real one).
func eventKey(kind string, g, i int) string {
	x := uint64(g)<<40 | uint64(i)
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return fmt.Sprintf("sangho_dedup:%s_%016x%02x%08x", kind, x, g, i)
}

// speed measures, on a fresh database, durable commits of new keys,
// durable claims of new keys, then lookups of the committed keys.
func speed(name, dir string, conc int, d time.Duration, r *row) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := open(name, dir)
	if err != nil {
		return err
	}
	defer e.close()
	exp := time.Now().Add(72 * time.Hour)
	counts := make([]int, conc)
	ops, cpu, err := phase(conc, d, func(g, i int) error {
		counts[g] = i + 1
		return e.commit(eventKey("evt", g, i), done, exp)
	})
	if err != nil {
		return err
	}
	r.commit, r.commitCPU = append(r.commit, ops), append(r.commitCPU, cpu)
	ops, cpu, err = phase(conc, d, func(g, i int) error {
		ok, err := e.claim(eventKey("new", g, i), []byte("lease:tok"), exp)
		if err == nil && !ok {
			err = fmt.Errorf("claim of a new key lost")
		}
		return err
	})
	if err != nil {
		return err
	}
	r.claim, r.claimCPU = append(r.claim, ops), append(r.claimCPU, cpu)
	ops, cpu, err = phase(conc, d, func(g, i int) error {
		rg := rand.IntN(conc)
		if counts[rg] == 0 {
			return nil
		}
		ok, err := e.lookup(eventKey("evt", rg, rand.IntN(counts[rg])), time.Now())
		if err == nil && !ok {
			err = fmt.Errorf("a committed record not found")
		}
		return err
	})
	if err != nil {
		return err
	}
	r.lookup, r.lookupCPU = append(r.lookup, ops), append(r.lookupCPU, cpu)
	return nil
}

// steady simulates a 72 h retention at a steady rate: 1.5 × records
// writes spread over 108 h of (simulated) time, each kept 72 h, the
// expired ones swept every simulated hour; at the end records are live
// and the rest expired. Then it closes the database, measures its size,
// and times reopening it and reading every record (loading an index).
func steady(name, dir string, records int, r *row) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := open(name, dir)
	if err != nil {
		return err
	}
	total := records * 3 / 2
	span := 108 * time.Hour
	start := time.Now().Add(-span)
	const batch = 10000
	perHour := total / 108
	keys, exps := make([]string, 0, batch), make([]time.Time, 0, batch)
	swept := 0
	for i := 0; i < total; {
		keys, exps = keys[:0], exps[:0]
		for ; len(keys) < batch && i < total; i++ {
			at := start.Add(time.Duration(float64(span) * float64(i) / float64(total)))
			keys = append(keys, eventKey("evt", 0, i))
			exps = append(exps, at.Add(72*time.Hour))
		}
		if err := e.load(keys, done, exps); err != nil {
			return err
		}
		if i/perHour != (i-len(keys))/perHour {
			now := start.Add(time.Duration(float64(span) * float64(i) / float64(total)))
			n, err := e.sweep(now)
			if err != nil {
				return err
			}
			swept += n
		}
	}
	if err := e.close(); err != nil {
		return err
	}
	r.size = dirSize(dir)
	t0 := time.Now()
	e, err = open(name, dir)
	if err != nil {
		return err
	}
	r.open = time.Since(t0)
	// open + read every live record, as loading an in-memory index does
	// (bbolt-tuned does it inside open already)
	n, err := scan(e)
	r.scan = time.Since(t0)
	r.live = n
	_ = swept
	if err != nil {
		return err
	}
	return e.close()
}

// binaries builds a tiny main per engine and reports what each adds to
// an empty one.
func binaries(dir string, rows map[string]*row) error {
	size := func(pkg string) (int64, error) {
		out := filepath.Join(dir, "bin-"+filepath.Base(pkg))
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return 0, err
		}
		fi, err := os.Stat(out)
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	base, err := size("./size/none")
	if err != nil {
		return err
	}
	for name, pkg := range map[string]string{"bbolt-today": "./size/bbolt", "bbolt-tuned": "./size/bbolt", "pebble": "./size/pebble", "badger": "./size/badger"} {
		if rows[name] == nil {
			continue
		}
		s, err := size(pkg)
		if err != nil {
			return err
		}
		rows[name].bin = s - base
	}
	return nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	ys := slices.Clone(xs)
	slices.Sort(ys)
	if len(ys)%2 == 1 {
		return ys[len(ys)/2]
	}
	return (ys[len(ys)/2-1] + ys[len(ys)/2]) / 2
}

func spread(xs []float64, f string) string {
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", median(xs), slices.Min(xs), slices.Max(xs))
}

func table(rows map[string]*row, conc int, d time.Duration, rounds, records int, want func(string) bool) string {
	var b strings.Builder
	if want("speed") {
		fmt.Fprintf(&b, "| engine | commit/s (durable) | CPU µs/commit | claim/s (durable) | CPU µs/claim | duplicate lookup/s | CPU µs/lookup |\n|---|---|---|---|---|---|---|\n")
		for _, n := range names {
			r := rows[n]
			fmt.Fprintf(&b, "| %s | %s | %.1f | %s | %.1f | %s | %.2f |\n", n, spread(r.commit, "%.0f"), median(r.commitCPU),
				spread(r.claim, "%.0f"), median(r.claimCPU), spread(r.lookup, "%.0f"), median(r.lookupCPU))
		}
		fmt.Fprintf(&b, "\n%d goroutines, %d interleaved rounds of %v per phase; median (min–max); CPU is the whole process's, per operation.\n\n", conc, rounds, d)
	}
	if want("size") || want("binary") {
		fmt.Fprintf(&b, "| engine | on disk after 72 h steady state, MiB | live records | open | open + read all (index load) | binary added, MiB |\n|---|---|---|---|---|---|\n")
		for _, n := range names {
			r := rows[n]
			fmt.Fprintf(&b, "| %s | %.1f | %d | %v | %v | %.1f |\n", n, float64(r.size)/(1<<20), r.live, r.open.Round(time.Millisecond), r.scan.Round(time.Millisecond), float64(r.bin)/(1<<20))
		}
		fmt.Fprintf(&b, "\nSteady state: %d writes over 108 simulated hours, each kept 72 h, the expired swept every simulated hour (Badger: its TTL, dropped at compaction), so %d live at the end; size of the closed database's files.\n", records*3/2, records)
	}
	return b.String()
}
