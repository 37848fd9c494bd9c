// Command sangho-bench measures sangho_dedup side by side with a plain
// reverse_proxy and with the backend alone, in one run on one machine:
//
//	go build -o bench/out/caddy ./cmd/caddy
//	go run ./cmd/sangho-bench --caddy bench/out/caddy --out bench/RESULTS.md
//
// (`make bench` does both.) It starts redis-server, a PostgreSQL (initdb
// and pg_ctl in a temporary directory), a minimal Go backend and one Caddy
// with six sites (plain reverse_proxy, Caddy's own respond answering what
// the backend answers, sangho_dedup on the memory store, on the default
// file store, on Redis, on PostgreSQL), all on 127.0.0.1, then runs every
// scenario in interleaved rounds and prints a Markdown report, with the
// disk's fsync latency and the file store's size over 300,000 events.
// The throughput scenarios run with 1 KiB and 64 KiB bodies of one long
// string and with 64 KiB bodies of many small nested values (a push of
// small commits, the ID scanner's worst case): --bodies picks.
//
// With --floor-caddy (a Caddy built from ./bench/floor/hmacfloor/caddy:
// the plugin and the bench-only floor) that Caddy serves every site, and
// one more, target hmacfloor: only buffering the body and checking its
// Sangho signature before the same reverse_proxy.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

const secret = "whsec_bench_secret"

// profileDir is --cpuprofile; profileAdmin is Caddy's admin address
// when it is set.
var profileDir, profileAdmin string

// checkFileStore returns --file-store's path made absolute, or an
// error if it holds no store.
func checkFileStore(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(filestore.StoreDir(abs)); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("--file-store %s: no store folder %s (fill one with -filescale fill, or leave --file-store out for a new store)", path, filestore.StoreDir(abs))
	}
	return abs, nil
}

// fileStoreNote says what the store given with --file-store held when
// the run began (at now): its records, and how many of them had expired
// since its fill ended, which the sweeper deletes during the runs (a
// store in use has about an hour of them waiting: the sweeper passes
// over every record about once an hour).
func fileStoreNote(path string, now time.Time) string {
	end, live, err := filestore.BenchFillEnd(path)
	if err != nil {
		return "not made by -filescale fill"
	}
	note := fmt.Sprintf("made by -filescale fill with %d live records, its load ending %s", live, end.UTC().Format("2006-01-02 15:04 MST"))
	if age := now.Sub(end); age > 0 && live > 0 {
		// The fill's records expire evenly over the retention, as
		// they arrived: age's share of them has expired since its end.
		share := min(1, float64(age)/float64(scaleRetention))
		note += fmt.Sprintf(", %s before this run: about %d of them (%.1f %%) had expired since, for the sweeper to delete during the runs (if no run has used this copy since the fill)", age.Round(time.Minute), int(share*float64(live)), 100*share)
	}
	return note
}

// bodies is --bodies: the body sizes (and shapes) to run, or "" for
// all.
var bodies string

// floorCaddy is --floor-caddy: the Caddy with the floor, or "".
var floorCaddy string

// fileStorePath is --file-store: the file site's store, if not a new
// one; fileStoreAtStart, what it held when the run began (fileStoreNote).
var fileStorePath, fileStoreAtStart string

// baselineNew is --baseline-new-events: wrk sends reverse_proxy and
// hmacfloor new events, each once, as it does the stores' 0 % runs,
// rather than 1,024 signed events in turn. wrk.lua builds every
// request before the run, so either costs wrk about the same CPU (the
// wrk CPU column); before it did, a new event cost wrk 3-4 times as
// much, CPU that a baseline sent reused events had for its Caddy.
var baselineNew bool

// loadStarts, when set, is called as the load of a scenario starts.
var loadStarts func()

func main() {
	caddyBin := flag.String("caddy", "bench/out/caddy", "Caddy binary with the plugin (go build -o bench/out/caddy ./cmd/caddy)")
	flag.StringVar(&floorCaddy, "floor-caddy", "", "Caddy binary with the plugin and the bench-only floor (go build -o bench/out/caddy-floor ./bench/floor/hmacfloor/caddy): it then serves every site in place of --caddy, and the target hmacfloor (buffer the body, check its HMAC, reverse_proxy) runs")
	out := flag.String("out", "", "also write the report to this file")
	dur := flag.Duration("duration", 5*time.Second, "length of each scenario run")
	rounds := flag.Int("rounds", 3, "interleaved rounds of all scenarios")
	conc := flag.Int("concurrency", 32, "connections for the throughput runs")
	rate := flag.Float64("rate", 300, "requests per second for the latency runs")
	redisOpts := flag.String("redis-options", "", "extra lines for the Redis store block, e.g. \"disable_pipeline\"")
	pgOpts := flag.String("postgres-options", "", "extra lines for the PostgreSQL store block, e.g. \"max_conns 16\"")
	flag.StringVar(&bodies, "bodies", "", "comma-separated bodies to run: "+strings.Join(bodyNames, ", ")+" (64KiB is one long string, the ID scanner's best case; 64KiB-nested a push of many small commits, its worst; the latency runs are 1KiB); default all")
	latencyOnly := flag.Bool("latency-only", false, "run only the fixed-rate latency scenarios")
	only := flag.String("only", "", "comma-separated targets to run (direct,respond,reverse_proxy,hmacfloor,memory,file,redis,postgres; the baselines reverse_proxy and respond always run; redis-server and PostgreSQL start only for redis and postgres); default all")
	flag.BoolVar(&baselineNew, "baseline-new-events", false, "wrk sends reverse_proxy and hmacfloor new events, each once, as it sends the stores' new events (default: 1,024 signed events in turn; wrk builds every request before the run, so both cost it about the same: see the report's wrk CPU column)")
	flag.StringVar(&fileStorePath, "file-store", "", "path of the file store for the request-level runs (default: a new, empty store in the run's temporary folder); a store filled by -filescale fill measures the site on a full store (the run writes to it: copy it first to keep it as filled)")
	growth := flag.Int("file-growth-events", 300000, "events for the file store's size measurement (0: skip)")
	sink := flag.String("sink", "", "internal: run as the backend on this address")
	growthOnly := flag.Bool("file-growth-only", false, "run only the file store's size measurement")
	flag.StringVar(&profileDir, "cpuprofile", "", "write a CPU profile of Caddy during each throughput scenario's first round into this directory (Caddy's admin API is then on a loopback port; the profiled round's figures include the profiler's cost)")
	generator := flag.String("generator", "auto", "load generator of the throughput runs: wrk, go, or auto (wrk if on PATH, else go); the fixed-rate latency runs always use the Go generator (wrk has no fixed rate)")
	fileScale := flag.String("filescale", "", "file store at scale (bench only): fill (a store of -filescale-records live records after 108 simulated hours kept 72 h, written by a bulk loader straight to the engine: a load in key order, then 36 h of churn), measure (in this fresh process: open cold, first claim, RSS, claim p99, commits with and without the sweep, size on disk) or serve (--caddy run on the store, cold: the time until it listens and answers a first event, then -filescale-rate signed events a second for -filescale-duration with Caddy's RSS sampled)")
	fileScalePath := flag.String("filescale-path", "", "the store's path for -filescale (its data goes in the folder beside it, .db replaced by .pebble)")
	fileScaleRecords := flag.Int("filescale-records", 0, "live records for -filescale fill (measure reads them from the note the fill leaves beside the store)")
	fileScaleWarm := flag.Bool("filescale-warm", false, "-filescale measure: leave the store's files in the page cache (open warm)")
	fileScaleCache := flag.Int("filescale-cache-mib", 0, "-filescale measure: the block cache's blocks in MiB (0: the store's default, 64; the two memtables' 32 MiB come on top (16 MiB before the evening of 2026-12-06, and before that day taken out of it))")
	flag.DurationVar(&fileScaleBacklog, "filescale-backlog", 0, "-filescale measure: at the end, jump the clock by this much (the records of that time then wait for the sweeper, as after Caddy was stopped that long) and time claims and commits of new IDs from 32 goroutines while the sweeper, on its own schedule, deletes many more expired records a tick than at the steady expiry; then without it (0: skip)")
	flag.BoolVar(&fileScalePacedFirst, "filescale-paced-first", false, "-filescale measure: the claims at -filescale-claim-rate first, before the runs as fast as 32 goroutines go (whose writes leave Pebble flushing and compacting for a while)")
	flag.Float64Var(&fileScaleClaimRate, "filescale-claim-rate", 1000, "-filescale measure: after the claim runs as fast as 32 goroutines go, the same at this many claims a second in all, beside the generator alone (a claim that does nothing) and the sync floor (a claim that syncs its lease to a log by group commit), before and after the store's; each claim's latency counted from its due time, and from its start with up to 1 ms of the timer's lateness left out (0: skip)")
	fileScaleDur := flag.Duration("filescale-duration", 5*time.Second, "-filescale measure: length of each latency and commit run; serve: length of the traffic")
	fileScaleRate := flag.Float64("filescale-rate", 100, "-filescale serve: events a second")
	fileScaleResend := flag.Float64("filescale-resend", 0.1, "-filescale serve: share of the events that resend an event answered earlier in the run (0..1)")
	fileScaleSample := flag.Duration("filescale-sample", 5*time.Second, "-filescale serve: interval of the RSS samples")
	flag.Parse()
	if *fileScale != "" {
		fileScaleCacheMiB = *fileScaleCache
		fileScaleServeConfig = serveConfig{caddy: *caddyBin, path: *fileScalePath, warm: *fileScaleWarm, duration: *fileScaleDur,
			rate: *fileScaleRate, resend: *fileScaleResend, sample: *fileScaleSample}
		if err := fileScaleMain(*fileScale, *fileScalePath, *fileScaleRecords, *fileScaleWarm, *fileScaleDur); err != nil {
			fmt.Fprintln(os.Stderr, "sangho-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *growthOnly {
		tmp, err := os.MkdirTemp("", "sangho-bench")
		if err == nil {
			defer os.RemoveAll(tmp)
			var out string
			if out, err = fileGrowth(filepath.Join(tmp, "growth.db"), *growth); err == nil {
				fmt.Print(out)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sangho-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *sink != "" {
		runSink(*sink)
		return
	}
	wrk, err := pickGenerator(*generator)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sangho-bench:", err)
		os.Exit(2)
	}
	if err := run(*caddyBin, *out, wrk, *dur, *rounds, *conc, *rate, *only, *redisOpts, *pgOpts, *latencyOnly, *growth); err != nil {
		fmt.Fprintln(os.Stderr, "sangho-bench:", err)
		os.Exit(1)
	}
}

// pickGenerator resolves --generator to the path of wrk, or "" for the
// Go generator.
func pickGenerator(g string) (string, error) {
	switch g {
	case "go":
		return "", nil
	case "wrk", "auto":
		p, err := exec.LookPath("wrk")
		if err != nil && g == "wrk" {
			return "", fmt.Errorf("--generator wrk: wrk not found (apt-get install wrk)")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sangho-bench: wrk not found, using the Go load generator (it shares the CPUs with Caddy and pulls every ratio toward 1)")
		}
		return p, nil
	}
	return "", fmt.Errorf("--generator must be wrk, go or auto, not %q", g)
}

func runSink(addr string) {
	_ = load.NewSink(addr).ListenAndServe()
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitPort(addr string) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not open within 15s", addr)
}

// cpuTicks returns utime+stime of a process in clock ticks (1/100 s).
func cpuTicks(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return u + s
}

// memKB returns VmRSS and VmHWM (peak) of a process in KiB.
func memKB(pid int) (rss, peak int) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		n, _ := strconv.Atoi(fs[1])
		switch fs[0] {
		case "VmRSS:":
			rss = n
		case "VmHWM:":
			peak = n
		}
	}
	return rss, peak
}

// storeServers reports whether a run of the targets only (comma
// separated, "" for all) needs redis-server and PostgreSQL.
func storeServers(only string) (needRedis, needPostgres bool) {
	if only == "" {
		return true, true
	}
	targets := strings.Split(only, ",")
	return slices.Contains(targets, "redis"), slices.Contains(targets, "postgres")
}

// redisCalls sums the calls of every command but the ones this tool
// sends (0 with no Redis: c nil).
func redisCalls(c *redis.Client) (int64, map[string]int64) {
	if c == nil {
		return 0, nil
	}
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, nil
	}
	var total int64
	by := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		name := strings.TrimPrefix(line[:strings.IndexByte(line, ':')], "cmdstat_")
		// Connection set-up and the local cache's heartbeat (CLIENT
		// TRACKING ON, about once a second), not requests' commands.
		if name == "info" || name == "hello" || name == "client|setinfo" || name == "ping" || name == "client|tracking" {
			continue
		}
		i := strings.Index(line, "calls=")
		j := strings.IndexByte(line[i:], ',')
		n, _ := strconv.ParseInt(line[i+6:i+j], 10, 64)
		by[name] = n
		total += n
	}
	return total, by
}

type scenario struct {
	target   string // direct, respond, reverse_proxy, hmacfloor, memory, file, redis, postgres
	url      string
	dup      float64
	body     int
	nested   bool // the body is a push of many small commits (load.NestedBodySize), not one long string
	rate     float64
	latency  bool
	results  []load.Result
	caddyCPU []float64 // µs per request
	redisCPU []float64 // the store's server: redis-server, or PostgreSQL's processes
	cmds     []float64 // Redis commands per request
}

func (s *scenario) name() string {
	d := "-"
	if isDeduped(s.target) {
		d = fmt.Sprintf("%.0f%%", s.dup*100)
	}
	mode := "c32"
	if s.latency {
		mode = fmt.Sprintf("%.0f/s", s.rate)
	}
	return fmt.Sprintf("%-13s dup %-4s body %-5s %s", s.target, d, s.bodyName(), mode)
}

// bodyNames are the bodies of a run, as --bodies and the report name
// them.
var bodyNames = []string{"1KiB", "64KiB", "64KiB-nested"}

// bodyName is the body's size, with -nested for the nested shape.
func (s *scenario) bodyName() string {
	if s.nested {
		return sizeName(s.body) + "-nested"
	}
	return sizeName(s.body)
}

// isDeduped tells the sangho_dedup targets from the baselines.
func isDeduped(target string) bool {
	return target == "memory" || target == "file" || target == "redis" || target == "postgres"
}

func sizeName(n int) string {
	if n >= 1024 {
		return strconv.Itoa(n/1024) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// benchTargets are the targets --only names.
var benchTargets = []string{"direct", "respond", "reverse_proxy", "hmacfloor", "floor_respond", "memory", "file", "redis", "postgres"}

func run(caddyBin, out, wrk string, dur time.Duration, rounds, conc int, rate float64, only, redisOpts, pgOpts string, latencyOnly bool, growthEvents int) error {
	if only != "" {
		for _, t := range strings.Split(only, ",") {
			if !slices.Contains(benchTargets, t) {
				return fmt.Errorf("--only: %q is not a target (%s)", t, strings.Join(benchTargets, ", "))
			}
		}
	}
	if bodies != "" {
		for _, z := range strings.Split(bodies, ",") {
			if !slices.Contains(bodyNames, z) {
				return fmt.Errorf("--bodies: %q is not a body of the run (%s)", z, strings.Join(bodyNames, ", "))
			}
		}
	}
	if fileStorePath != "" {
		var err error
		if fileStorePath, err = checkFileStore(fileStorePath); err != nil {
			return err
		}
		fileStoreAtStart = fileStoreNote(fileStorePath, time.Now())
	}
	if floorCaddy != "" {
		if _, err := os.Stat(floorCaddy); err != nil {
			return fmt.Errorf("--floor-caddy: no Caddy binary at %s: build it with go build -o %s ./bench/floor/hmacfloor/caddy", floorCaddy, floorCaddy)
		}
		caddyBin = floorCaddy
	} else if only != "" && slices.Contains(strings.Split(only, ","), "hmacfloor") {
		return fmt.Errorf("--only hmacfloor needs --floor-caddy (go build -o bench/out/caddy-floor ./bench/floor/hmacfloor/caddy)")
	}
	if _, err := os.Stat(caddyBin); err != nil {
		return fmt.Errorf("no Caddy binary at %s: build it with go build -o %s ./cmd/caddy", caddyBin, caddyBin)
	}
	wantRedis, wantPostgres := storeServers(only)
	var redisBin string
	if wantRedis {
		var err error
		if redisBin, err = exec.LookPath("redis-server"); err != nil {
			return fmt.Errorf("redis-server not found: apt-get install redis-server")
		}
	}
	tmp, err := os.MkdirTemp("", "sangho-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	start := func(name string, args ...string) (*exec.Cmd, error) {
		cmd := exec.Command(name, args...)
		logf, _ := os.Create(filepath.Join(tmp, filepath.Base(name)+".log"))
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(runtime.NumCPU()))
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		procs = append(procs, cmd)
		return cmd, nil
	}

	// Without redis-server, the Redis site's store is provisioned on a
	// port nothing listens on, and never sent to.
	redisPort, backendPort := freePort(), freePort()
	ports := [6]int{freePort(), freePort(), freePort(), freePort(), freePort(), freePort()}
	var rs *exec.Cmd
	if wantRedis {
		if rs, err = start(redisBin, "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp); err != nil {
			return err
		}
	}
	self, _ := os.Executable()
	if _, err := start(self, "--sink", "127.0.0.1:"+strconv.Itoa(backendPort)); err != nil {
		return err
	}
	backend := "127.0.0.1:" + strconv.Itoa(backendPort)
	var pg *pgServer
	pgDSN := ""
	if wantPostgres {
		if pg, err = startPostgres(tmp); err != nil {
			return err
		}
		defer pg.stop()
		pgDSN = pg.dsn()
	}
	// The CPU of the store's server: redis-server's and PostgreSQL's
	// (only the target's is busy during its scenario).
	storeTicks := func() float64 {
		var n float64
		if rs != nil {
			n += cpuTicks(rs.Process.Pid)
		}
		if pg != nil {
			n += pg.cpuTicks()
		}
		return n
	}
	if profileDir != "" {
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			return err
		}
		profileAdmin = fmt.Sprintf("127.0.0.1:%d", freePort())
	}
	filePath := filepath.Join(tmp, "dedup.db")
	if fileStorePath != "" {
		filePath = fileStorePath
	}
	var floorPort, floorRespondPort int
	if floorCaddy != "" {
		floorPort, floorRespondPort = freePort(), freePort()
	}
	caddyfile := benchCaddyfile(ports, [2]int{floorPort, floorRespondPort}, backend, redisPort, redisOpts, filePath, pgDSN, pgOpts)
	cfgPath := filepath.Join(tmp, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(caddyfile), 0o600); err != nil {
		return err
	}
	cd, err := start(caddyBin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	if err != nil {
		return err
	}
	addrs := []string{backend}
	if rs != nil {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(redisPort))
	}
	for _, p := range ports[:5] {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	if pg != nil {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(ports[5]))
	}
	if floorPort != 0 {
		addrs = append(addrs, "127.0.0.1:"+strconv.Itoa(floorPort), "127.0.0.1:"+strconv.Itoa(floorRespondPort))
	}
	for _, a := range addrs {
		if err := waitPort(a); err != nil {
			log, _ := os.ReadFile(filepath.Join(tmp, "caddy.log"))
			return fmt.Errorf("%v\n%s", err, log)
		}
	}
	var rc *redis.Client
	if rs != nil {
		rc = redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(redisPort)})
		defer rc.Close()
	}

	urls := map[string]string{
		"direct":        "http://" + backend + "/",
		"reverse_proxy": fmt.Sprintf("http://127.0.0.1:%d/", ports[0]),
		"memory":        fmt.Sprintf("http://127.0.0.1:%d/", ports[1]),
		"redis":         fmt.Sprintf("http://127.0.0.1:%d/", ports[2]),
		"file":          fmt.Sprintf("http://127.0.0.1:%d/", ports[3]),
		"respond":       fmt.Sprintf("http://127.0.0.1:%d/", ports[4]),
		"postgres":      fmt.Sprintf("http://127.0.0.1:%d/", ports[5]),
		"hmacfloor":     fmt.Sprintf("http://127.0.0.1:%d/", floorPort),
		"floor_respond": fmt.Sprintf("http://127.0.0.1:%d/", floorRespondPort),
	}
	targets := []string{"direct", "respond", "reverse_proxy", "memory", "file", "redis"}
	if floorPort != 0 {
		targets = slices.Insert(targets, 3, "hmacfloor", "floor_respond")
	}
	if pg != nil {
		targets = append(targets, "postgres")
	}
	deduped := isDeduped
	var all []*scenario
	for _, body := range []struct {
		size   int
		nested bool
	}{{1024, false}, {64 * 1024, false}, {64 * 1024, true}} {
		for _, t := range targets {
			dups := []float64{0}
			if deduped(t) {
				dups = []float64{0, 0.5, 1}
			}
			for _, d := range dups {
				all = append(all, &scenario{target: t, url: urls[t], dup: d, body: body.size, nested: body.nested})
			}
		}
	}
	for _, t := range targets {
		if t != "respond" {
			all = append(all, &scenario{target: t, url: urls[t], body: 1024, rate: rate, latency: true})
		}
	}

	if latencyOnly {
		all = slices.DeleteFunc(all, func(s *scenario) bool { return !s.latency })
	}
	if bodies != "" {
		sizes := strings.Split(bodies, ",")
		all = slices.DeleteFunc(all, func(s *scenario) bool { return !slices.Contains(sizes, s.bodyName()) })
	}
	if only != "" {
		keep := append(strings.Split(only, ","), "reverse_proxy", "respond") // the baselines always run
		if slices.Contains(keep, "hmacfloor") {
			keep = append(keep, "floor_respond")
		}
		all = slices.DeleteFunc(all, func(s *scenario) bool { return !slices.Contains(keep, s.target) })
	}
	fmt.Fprintf(os.Stderr, "%d scenarios x %d rounds x %v\n", len(all), rounds, dur)
	for r := range rounds {
		for _, s := range all {
			cfg := load.Config{URL: s.url, Secret: secret, Duration: dur, Duplicates: s.dup, BodySize: s.body, Nested: s.nested, Concurrency: conc}
			if s.latency {
				cfg.Concurrency, cfg.Rate = 16, s.rate
			}
			if s.dup > 0 {
				cfg.Warmup = 32
			}
			var profiled chan struct{}
			var c0, r0 float64
			var k0 int64
			// The counts start, and the profile, from the moment the load
			// starts: wrk's events are signed first and its requests built
			// (a while for 64 KiB ones), while the store's background work
			// (a sweep, compactions) goes on.
			loadStarts = func() {
				c0, r0 = cpuTicks(cd.Process.Pid), storeTicks()
				k0, _ = redisCalls(rc)
				if profileDir != "" && r == 0 && !s.latency {
					profiled = profile(s, dur)
				}
			}
			var res load.Result
			counted := cfg.Warmup // requests sent inside the counts: the Go generator's warm-up
			if wrk != "" && !s.latency {
				counted = 0 // wrkData's warm-up is sent before wrk starts
				unique := deduped(s.target) || baselineNew && (s.target == "reverse_proxy" || s.target == "hmacfloor")
				res, err = wrkRun(context.Background(), wrk, tmp, cfg, unique)
			} else {
				loadStarts()
				res, err = load.Run(context.Background(), cfg)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.name(), err)
			}
			c1, r1 := cpuTicks(cd.Process.Pid), storeTicks()
			if profiled != nil {
				<-profiled
			}
			k1, _ := redisCalls(rc)
			n := float64(res.Requests + counted)
			s.results = append(s.results, res)
			s.caddyCPU = append(s.caddyCPU, (c1-c0)*10000/n) // ticks are 10 ms: µs per request
			s.redisCPU = append(s.redisCPU, (r1-r0)*10000/n)
			s.cmds = append(s.cmds, float64(k1-k0)/n)
			fmt.Fprintf(os.Stderr, "round %d  %s  %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  Caddy %6.1f µs/req  store server %5.1f µs/req  load generator %5.1f µs/req  %v\n", r+1, s.name(), res.Throughput, res.P50, res.P99,
				s.caddyCPU[len(s.caddyCPU)-1], s.redisCPU[len(s.redisCPU)-1], res.GeneratorCPU, res.ByStatus)
		}
	}

	// Memory: 64 concurrent 1 MiB bodies through the memory-store site.
	rssBefore, _ := memKB(cd.Process.Pid)
	big, err := load.Run(context.Background(), load.Config{URL: urls["memory"], Secret: secret, Events: 64 * 8, BodySize: 1 << 20, Concurrency: 64})
	if err != nil {
		return err
	}
	rssAfter, peak := memKB(cd.Process.Pid)

	fsync := measureFsync(tmp)
	var growth string
	if growthEvents > 0 {
		fmt.Fprintf(os.Stderr, "file store size over %d events...\n", growthEvents)
		if growth, err = fileGrowth(filepath.Join(tmp, "growth.db"), growthEvents); err != nil {
			return err
		}
	}
	report := render(all, wrk, rounds, dur, conc, rate, rssBefore, rssAfter, peak, big) + fsync + growth
	fmt.Print(report)
	if out != "" {
		return os.WriteFile(out, []byte(report), 0o644)
	}
	return nil
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func median(xs []float64) float64 {
	ys := slices.Clone(xs)
	sort.Float64s(ys)
	if len(ys)%2 == 1 {
		return ys[len(ys)/2]
	}
	return (ys[len(ys)/2-1] + ys[len(ys)/2]) / 2
}

func render(all []*scenario, wrk string, rounds int, dur time.Duration, conc int, rate float64, rssBefore, rssAfter, peak int, big load.Result) string {
	var b strings.Builder
	host, _ := os.Hostname()
	cpu := "unknown"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(l[strings.IndexByte(l, ':')+1:])
				break
			}
		}
	}
	commit, _ := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	fmt.Fprintf(&b, "# Benchmark results\n\n")
	fmt.Fprintf(&b, "- date: %s; commit: %s; machine: %s, %d CPUs (%s), %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), strings.TrimSpace(string(commit)), host, runtime.NumCPU(), cpu, runtime.Version())
	fmt.Fprintf(&b, "- every process (load generator, Caddy, redis-server, PostgreSQL, backend) shares these CPUs; loopback only; PostgreSQL with fsync and synchronous_commit on\n")
	if wrk != "" {
		v, _ := exec.Command(wrk, "--version").CombinedOutput()
		fmt.Fprintf(&b, "- load generator of the throughput runs: wrk (%s), 1 thread, events signed beforehand, each new event sent once; the fixed-rate latency runs: the Go generator (wrk has no fixed rate)\n", strings.TrimSpace(strings.SplitN(string(v), "\n", 2)[0]))
	} else {
		fmt.Fprintf(&b, "- load generator: the Go generator (wrk not found): it takes CPU from Caddy on the same cores and pulls every ratio toward 1\n")
	}
	fmt.Fprintf(&b, "- %d interleaved rounds of %v per scenario; throughput and latency are medians of the rounds, ratios and CPU differences the median of the per-round figures (each round against the baseline of the same round; min–max in brackets); concurrency %d (latency runs: %.0f req/s, 16 connections, each request counted from its due time, with up to 1 ms of the pacer's timer lateness left out)\n", rounds, dur, conc, rate)
	if slices.ContainsFunc(all, func(s *scenario) bool { return s.nested }) {
		commits := strings.Count(load.NestedBodySize("evt_x", 64<<10), `"tree_id"`)
		fmt.Fprintf(&b, "- bodies: 1KiB and 64KiB are mostly one long string (the ID scanner's best case); 64KiB-nested is a push of about %d small commits, exactly 65,536 bytes (many small nested values: its worst case)\n", commits)
	}
	if wrk != "" {
		if baselineNew {
			fmt.Fprintf(&b, "- reverse_proxy and hmacfloor were sent new events, each once, as the stores' 0 %% runs (--baseline-new-events); respond and floor_respond, the duplicates' baselines, 1,024 events in turn\n")
		} else {
			fmt.Fprintf(&b, "- the baselines were sent 1,024 signed events in turn, the stores' 0 %% runs new events each once; wrk builds every request before the run, so a new event costs it about what a repeated one does (the wrk CPU column; --baseline-new-events sends the baselines new events too), and Caddy's CPU is counted from the load's start\n")
		}
	}
	if fileStorePath != "" {
		fmt.Fprintf(&b, "- the file store's site ran on the store at %s (given with --file-store; %s), not on a new, empty one\n", fileStorePath, fileStoreAtStart)
	}
	if os.Getenv("WALEXP") != "" {
		if os.Getenv("WALEXP_LEASE") != "" {
			fmt.Fprintf(&b, "- WALEXP and WALEXP_LEASE set: the memory store's site is the durable floor with leases (bench/floor/wal-floor.patch: a new event's lease written and fdatasync'ed at its claim, its record at its commit, each by group commit), if this Caddy was built with that patch\n")
		} else {
			fmt.Fprintf(&b, "- WALEXP set: the memory store's site is the durable floor (bench/floor/wal-floor.patch: one write and one fdatasync per group commit), if this Caddy was built with that patch\n")
		}
	}
	fmt.Fprintf(&b, "- reproduce: `make bench` (or `go build -o bench/out/caddy ./cmd/caddy && go run ./cmd/sangho-bench --caddy bench/out/caddy`)\n\n")

	base, respond := map[string]*scenario{}, map[string]*scenario{}
	for _, s := range all {
		if s.target == "respond" && !s.latency {
			respond[s.bodyName()] = s
		}
		if s.target == "reverse_proxy" {
			key := s.bodyName()
			if s.latency {
				key = "latency"
			}
			base[key] = s
		}
	}
	fmt.Fprintf(&b, "## Throughput at concurrency %d\n\n", conc)
	fmt.Fprintf(&b, "| scenario | req/s | × reverse_proxy | p50 ms | p99 ms | Caddy CPU µs/req | Δ vs reverse_proxy, µs | store server CPU µs/req | Redis cmds/req | wrk CPU µs/req | answers |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range all {
		if s.latency {
			continue
		}
		bs := base[s.bodyName()]
		thr := median(tp(s.results))
		fmt.Fprintf(&b, "| %s | %.0f | %s | %.2f | %.2f | %.1f | %s | %.1f | %.2f | %.1f | %s |\n", s.name(), thr, ratioSpread(s, bs),
			median(field(s.results, func(r load.Result) float64 { return r.P50 })),
			median(field(s.results, func(r load.Result) float64 { return r.P99 })),
			median(s.caddyCPU), deltaSpread(s, bs), median(s.redisCPU), mean(s.cmds),
			median(field(s.results, func(r load.Result) float64 { return r.GeneratorCPU })), answers(s.results[len(s.results)-1]))
	}
	fmt.Fprintf(&b, "\n## 100 %% duplicates against Caddy's own `respond`\n\n")
	fmt.Fprintf(&b, "A duplicate is answered by `sangho_dedup` without the backend, so its floor is Caddy answering by itself: a site with `respond` and the same answer.\n\n")
	fmt.Fprintf(&b, "| scenario | req/s | × respond | Caddy CPU µs/req | Δ vs respond, µs |\n|---|---|---|---|---|\n")
	for _, s := range all {
		rs := respond[s.bodyName()]
		if s.latency || (s.dup != 1 && s.target != "floor_respond") || rs == nil {
			continue
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %.1f | %s |\n", s.name(), median(tp(s.results)), ratioSpread(s, rs), median(s.caddyCPU), deltaSpread(s, rs))
	}
	b.WriteString(floorSection(all, base, respond))
	fmt.Fprintf(&b, "\n## Latency at a fixed %.0f req/s (new events, 1 KiB)\n\n", rate)
	fmt.Fprintf(&b, "| scenario | p50 ms | p90 ms | p99 ms | max ms | p99 added vs reverse_proxy (same round), ms |\n|---|---|---|---|---|---|\n")
	for _, s := range all {
		if !s.latency {
			continue
		}
		p99 := median(field(s.results, func(r load.Result) float64 { return r.P99 }))
		var added []float64
		for i, r := range s.results {
			if i < len(base["latency"].results) {
				added = append(added, r.P99-base["latency"].results[i].P99)
			}
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.2f | %.2f | %.2f | %+.2f (%+.2f–%+.2f) |\n", s.name(),
			median(field(s.results, func(r load.Result) float64 { return r.P50 })),
			median(field(s.results, func(r load.Result) float64 { return r.P90 })), p99,
			median(field(s.results, func(r load.Result) float64 { return r.Max })),
			median(added), slices.Min(added), slices.Max(added))
	}
	fmt.Fprintf(&b, "\n## Memory\n\n")
	fmt.Fprintf(&b, "64 concurrent 1 MiB events (%d in all, memory store): Caddy RSS %d MiB before, %d MiB after; peak RSS of the whole run %d MiB (64 × 1 MiB buffers alone are 64 MiB). Answers: %s.\n",
		big.Requests, rssBefore/1024, rssAfter/1024, peak/1024, answers(big))
	return b.String()
}

// floorSection compares the memory store's site with the floor (target
// hmacfloor: buffering the body and checking its HMAC, nothing else):
// new events against reverse_proxy, and, since a duplicate needs no
// backend, 100 % duplicates against respond beside the floor's own
// ratio to respond.
func floorSection(all []*scenario, base, respond map[string]*scenario) string {
	floor, floorRespond, mem, dup := map[string]*scenario{}, map[string]*scenario{}, map[string]*scenario{}, map[string]*scenario{}
	for _, s := range all {
		if s.latency {
			continue
		}
		switch {
		case s.target == "hmacfloor":
			floor[s.bodyName()] = s
		case s.target == "floor_respond":
			floorRespond[s.bodyName()] = s
		case s.target == "memory" && s.dup == 0:
			mem[s.bodyName()] = s
		case s.target == "memory" && s.dup == 1:
			dup[s.bodyName()] = s
		}
	}
	if len(floor) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n## The floor: buffering the body and checking its HMAC\n\n")
	fmt.Fprintf(&b, "`hmacfloor` is Caddy with a handler that only buffers the body (max_body_size 2MiB, pooled buffers) and checks its Sangho signature (the sangho provider's check), then the same `reverse_proxy` (bench/floor/hmacfloor, not in the plugin); `floor_respond`, the floor of a duplicate, is the same handler followed by `respond` (no backend).\n\n")
	fmt.Fprintf(&b, "| body | floor × reverse_proxy | memory new × reverse_proxy | floor_respond × respond | memory 100 %% dup × respond |\n|---|---|---|---|---|\n")
	for _, k := range bodyNames {
		f := floor[k]
		if f == nil {
			continue
		}
		cell := func(s, against *scenario) string {
			if s == nil || against == nil {
				return "—"
			}
			return ratioSpread(s, against)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", k, cell(f, base[k]), cell(mem[k], base[k]), cell(floorRespond[k], respond[k]), cell(dup[k], respond[k]))
	}
	return b.String()
}

// ratioSpread is the median of the per-round throughput ratios to the
// baseline (the same round), with their min–max.
func ratioSpread(s, base *scenario) string {
	var rs []float64
	for i := range min(len(s.results), len(base.results)) {
		rs = append(rs, s.results[i].Throughput/base.results[i].Throughput)
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", median(rs), slices.Min(rs), slices.Max(rs))
}

// deltaSpread is the median of the per-round differences of Caddy's CPU
// per request to the baseline's in the same round, with their min–max.
func deltaSpread(s, base *scenario) string {
	var ds []float64
	for i := range min(len(s.caddyCPU), len(base.caddyCPU)) {
		ds = append(ds, s.caddyCPU[i]-base.caddyCPU[i])
	}
	return fmt.Sprintf("%+.1f (%+.1f–%+.1f)", median(ds), slices.Min(ds), slices.Max(ds))
}

func tp(rs []load.Result) []float64 {
	return field(rs, func(r load.Result) float64 { return r.Throughput })
}

func field(rs []load.Result, f func(load.Result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

func answers(r load.Result) string {
	var parts []string
	for _, k := range sortedKeys(r.ByStatus) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, r.ByStatus[k]))
	}
	if n := r.ByDedup["duplicate"]; n > 0 {
		parts = append(parts, fmt.Sprintf("dup×%d", n))
	}
	if r.Unsent > 0 { // due, never sent: Caddy was that far behind
		parts = append(parts, fmt.Sprintf("unsent×%d", r.Unsent))
	}
	return strings.Join(parts, " ")
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// benchCaddyfile is the config of the benchmark's one Caddy: one site
// per target (plain reverse_proxy, sangho_dedup on each store, respond),
// each endpoint named after its store (one config may not give one name
// to two stores).
func benchCaddyfile(ports [6]int, floorPorts [2]int, backend string, redisPort int, redisOpts, filePath, pgDSN, pgOpts string) string {
	site := func(port int, body string) string {
		return fmt.Sprintf("http://127.0.0.1:%d {\n\tbind 127.0.0.1\n%s\n}\n", port, body)
	}
	dedup := func(port int, name, store string) string {
		return site(port, fmt.Sprintf("\tsangho_dedup {\n\t\tsecret %s\n\t\tmax_body_size 2MiB\n\t\t%s\n\t\tname %s\n\t}\n\treverse_proxy %s",
			secret, store, name, backend))
	}
	pgSite := ""
	if pgDSN != "" {
		pgSite = dedup(ports[5], "postgres", fmt.Sprintf("store postgres {\n\t\t\tdsn %q\n\t\t\t%s\n\t\t}", pgDSN, pgOpts))
	}
	floorSite := ""
	if floorPorts[0] != 0 {
		floor := fmt.Sprintf("\tsangho_hmac_floor {\n\t\tsecret %s\n\t\tmax_body_size 2MiB\n\t}\n", secret)
		floorSite = site(floorPorts[0], floor+"\treverse_proxy "+backend) +
			site(floorPorts[1], floor+"\theader Content-Type application/json\n\trespond \"{\\\"received\\\":true}\" 200")
	}
	admin := "admin off"
	if profileAdmin != "" {
		admin = "admin " + profileAdmin
	}
	return "{\n\t" + admin + "\n\tauto_https off\n\tpersist_config off\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n" +
		site(ports[0], "\treverse_proxy "+backend) +
		dedup(ports[1], "memory", "store memory") +
		dedup(ports[2], "redis", fmt.Sprintf("store redis {\n\t\t\taddress 127.0.0.1:%d\n\t\t\t%s\n\t\t}", redisPort, redisOpts)) +
		dedup(ports[3], "file", "store file "+filePath) +
		site(ports[4], "\theader Content-Type application/json\n\trespond \"{\\\"received\\\":true}\" 200") +
		pgSite + floorSite
}

// profile fetches a CPU profile of Caddy over most of the scenario's run
// into --cpuprofile; the channel closes when it is written.
func profile(s *scenario, dur time.Duration) chan struct{} {
	done := make(chan struct{})
	secs := max(int(dur.Seconds())-1, 1)
	name := strings.Join(strings.Fields(s.name()), "_")
	name = strings.NewReplacer("%", "pct", "/", "per").Replace(name)
	go func() {
		defer close(done)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", profileAdmin, secs))
		if err != nil {
			fmt.Fprintln(os.Stderr, "sangho-bench: profile:", err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(profileDir, name+".pprof"))
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			f.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sangho-bench: profile:", err)
		}
	}()
	return done
}
