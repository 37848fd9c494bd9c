//go:build soak

// The soak: a long run at a moderate rate with redeliveries and a few
// faults a minute, on Redis and on the default file store side by side,
// sampling what would leak. Not part of the test command (it is long by
// design); `make soak` runs it for 60 minutes, .ci/run for 2:
//
//	SOAK_DURATION=60m go test -tags soak -count=1 -v -timeout 90m -run TestSoak ./reliability
package reliability

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// soakTarget is one Caddy under soak, with its store and ledger.
type soakTarget struct {
	name     string
	site     string
	p        *caddyProc
	l        *ledger.Ledger
	s        *sender
	redis    *redis.Client // Redis target only
	storeDir string        // file target only: the store's Pebble folder

	mu      sync.Mutex
	ids     []string
	acked   map[string]bool
	samples []soakSample
}

type soakSample struct {
	at              time.Duration
	rssMiB          float64
	goroutines, fds int
	// backend: Caddy's established connections to its backend, the
	// reverse proxy's keep-alive pool; each holds 2 goroutines (its
	// read and write loops) and 1 FD.
	backend                int
	storeMiB               float64 // Redis used_memory, or the file store's folder's size (-1: not found)
	keys                   int     // Redis keys, or the file's records
	events, acked, retried int64
}

func TestSoak(t *testing.T) {
	dur := 2 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("SOAK_DURATION")); err == nil && d > 0 {
		dur = d
	}
	// The retention window must fill well before the end: a sixth of the
	// run, so that the last half is in the steady state.
	retention := max(10*time.Second, min(5*time.Minute, dur/6))
	rate := 40.0 // new events per second and target; 30 % more are redeliveries
	t.Logf("soak: %v, retention %v, %.0f new events/s per store, 30%% redeliveries, faults every 20 s", dur, retention, rate)

	r := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "everysec")
	// A tolerance of half the retention: a shorter retention than twice
	// the tolerance is refused (a captured delivery would outlive its
	// record), and the sender signs each attempt as it sends it.
	extra := "retention " + retention.String() + "\n\t\ttolerance " + (retention / 2).String()
	targets := []*soakTarget{
		{name: "redis", redis: r.Client(t)},
		{name: "file"},
	}
	for _, tg := range targets {
		tg.l = ledger.New(t)
		store := ""
		if tg.name == "redis" {
			store = redisStore(r.Addr)
		}
		tg.site = siteConfig(store, tg.l.Addr, extra)
		tg.p = startCaddy(t, tg.site)
		tg.s = newSender([]string{tg.p.url}, 1)
		tg.acked = map[string]bool{}
		if tg.name == "file" {
			tg.storeDir = filepath.Join(filepath.Dir(tg.p.cfg), "caddy", "sangho_dedup", "dedup.pebble")
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Add(2)
		go func() { defer wg.Done(); tg.drive(ctx, rate, retention) }()
		go func() { defer wg.Done(); tg.sample(ctx, start) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); soakFaults(ctx, t, r, targets) }()
	wg.Wait()

	for _, tg := range targets {
		tg.report(t, retention)
		check(t, "soak "+tg.name, tg.s, tg.l, tg.ids, tg.acked, false)
	}
}

// drive sends new events at rate, and redeliveries of recent ones (30 %
// more), each retried until acknowledged; redeliveries stay within half
// the retention, inside the window where they must be duplicates.
func (tg *soakTarget) drive(ctx context.Context, rate float64, retention time.Duration) {
	type sent struct {
		id   string
		body []byte
		at   time.Time
	}
	var recent []sent
	var inflight sync.WaitGroup
	defer inflight.Wait()
	rnd := rand.New(rand.NewPCG(1, uint64(len(tg.name))))
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	deliver := func(id string, body []byte, seed uint64) {
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			ok := tg.s.deliver(id, body, rand.New(rand.NewPCG(seed, 7)))
			tg.mu.Lock()
			if ok {
				tg.acked[id] = true
				tg.s.fig.acked.Add(1)
			}
			tg.mu.Unlock()
		}()
	}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		id := fmt.Sprintf("evt_soak_%s_%07d", tg.name, i)
		body := []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","data":{"object":{"n":%d}}}`, id, i))
		tg.mu.Lock()
		tg.ids = append(tg.ids, id)
		tg.mu.Unlock()
		tg.s.fig.events.Add(1)
		deliver(id, body, uint64(i))
		recent = append(recent, sent{id, body, time.Now()})
		for len(recent) > 0 && time.Since(recent[0].at) > retention/2 {
			recent = recent[1:]
		}
		if rnd.Float64() < 0.3 && len(recent) > 1 {
			old := recent[rnd.IntN(len(recent))]
			deliver(old.id, old.body, uint64(i)<<20)
		}
	}
}

// soakFaults injects a fault every 20 s, in turn: the backends answer
// 500 for a second, Redis is paused for a second, each Caddy reloads
// (the same config: caddyProc.reload forces it).
func soakFaults(ctx context.Context, t *testing.T, r *redistest.Server, targets []*soakTarget) {
	tick := time.NewTicker(20 * time.Second)
	defer tick.Stop()
	rc := r.Client(t)
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		switch n % 3 {
		case 0:
			for _, tg := range targets {
				tg.l.Behave(func(string, int) ledger.Action { return ledger.Action{Status: 500} })
			}
			time.Sleep(time.Second)
			for _, tg := range targets {
				tg.l.Behave(nil)
			}
		case 1:
			rc.Do(context.Background(), "CLIENT", "PAUSE", 1000, "ALL")
		case 2:
			for _, tg := range targets {
				if err := tg.p.reload(tg.site); err != nil {
					t.Errorf("%s: reload: %v", tg.name, err)
				}
			}
		}
		for _, tg := range targets {
			tg.s.fig.faults.Add(1)
		}
	}
}

// sample records the process and store figures every 10 s, 5 s off the
// faults (which come every 20 s), once the fault before has settled.
//
// Connections are not leaks unless they outlive their pool: the idle
// keep-alive connections of the load generator (1 goroutine and 1 FD
// each in Caddy) and of Caddy's reverse proxy to the backend (2 and 1)
// stay open as many as the largest burst of concurrent requests so far,
// the pile-up behind a fault, which varies from run to run. The
// generator closes its idle ones before each sample; the backend pool
// is counted, and report checks it against its bound apart.
func (tg *soakTarget) sample(ctx context.Context, start time.Time) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(5 * time.Second):
	}
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		tg.s.client.CloseIdleConnections()
		time.Sleep(200 * time.Millisecond) // for Caddy to see them closed
		pid := tg.p.cmd.Process.Pid
		s := soakSample{at: time.Since(start).Round(time.Second), rssMiB: float64(procStatusKB(pid, "VmRSS:")) / 1024,
			goroutines: goroutines(tg.p.admin), fds: countFDs(pid), backend: connsTo(pid, tg.l.Addr),
			events: tg.s.fig.events.Load(), acked: tg.s.fig.acked.Load(), retried: tg.s.fig.retries.Load()}
		if tg.redis != nil {
			info, _ := tg.redis.Info(context.Background(), "memory").Result()
			s.storeMiB = float64(infoField(info, "used_memory")) / (1 << 20)
			n, _ := tg.redis.DBSize(context.Background()).Result()
			s.keys = int(n)
		} else {
			s.storeMiB, s.keys = -1, -1
			if n, err := folderBytes(tg.storeDir); err == nil {
				s.storeMiB = float64(n) / (1 << 20)
			}
		}
		tg.mu.Lock()
		tg.samples = append(tg.samples, s)
		tg.mu.Unlock()
	}
}

// report prints the samples and fails if a figure trends upward once
// the retention window is full: the mean of the last third of the
// steady-state samples against the first third. Goroutines and FDs are
// counted less the backend pool's share; the pool itself must stay
// within reverse_proxy's keep-alive bound.
func (tg *soakTarget) report(t *testing.T, retention time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "soak %s:\n| t | RSS MiB | goroutines | FDs | backend conns | store MiB | keys | events | acked |\n", tg.name)
	var steady []soakSample
	for _, s := range tg.samples {
		keys := strconv.Itoa(s.keys)
		if s.keys < 0 {
			keys = "-" // the store is locked by Caddy: its folder's size is the figure
		}
		if s.storeMiB < 0 {
			t.Errorf("soak %s: the store's folder %s was not found at %v: its size is not measured", tg.name, tg.storeDir, s.at)
		}
		fmt.Fprintf(&b, "| %v | %.1f | %d | %d | %d | %.2f | %s | %d | %d |\n", s.at, s.rssMiB, s.goroutines, s.fds, s.backend, s.storeMiB, keys, s.events, s.acked)
		if s.at > 2*retention {
			steady = append(steady, s)
		}
		// reverse_proxy keeps at most 32 idle connections to a backend;
		// a few more may be busy when the sample is taken.
		if s.backend > 32+8 {
			t.Errorf("soak %s: %d connections to the backend at %v: more than reverse_proxy's pool keeps", tg.name, s.backend, s.at)
		}
	}
	t.Log(b.String())
	fmt.Print(b.String())
	if len(steady) < 6 {
		t.Errorf("soak %s: only %d samples after the retention window filled: run longer", tg.name, len(steady))
		return
	}
	third := len(steady) / 3
	first, last := steady[:third], steady[len(steady)-third:]
	type metric struct {
		name  string
		get   func(soakSample) float64
		slack float64 // absolute growth allowed on top of 15 %
	}
	for _, m := range []metric{
		{"RSS MiB", func(s soakSample) float64 { return s.rssMiB }, 8},
		{"goroutines (less 2 a backend connection)", func(s soakSample) float64 { return float64(s.goroutines - 2*s.backend) }, 20},
		{"open FDs (less the backend connections)", func(s soakSample) float64 { return float64(s.fds - s.backend) }, 10},
		// A Pebble folder grows by a memtable's log (up to 16 MiB) before
		// it is flushed to a table, then shrinks as compactions drop what
		// expired: up to two memtables over the steady state is no leak.
		{"store MiB", func(s soakSample) float64 { return s.storeMiB }, map[bool]float64{true: 0.5, false: 32}[tg.redis != nil]},
		{"keys", func(s soakSample) float64 { return float64(s.keys) }, 200},
	} {
		a, z := meanOf(first, m.get), meanOf(last, m.get)
		if z > a*1.15+m.slack {
			t.Errorf("soak %s: %s trends upward once the retention window is full: %.1f in the first third of the steady state, %.1f in the last", tg.name, m.name, a, z)
		}
	}
}

// folderBytes is the size of the files in dir (a Pebble folder has no
// subfolders).
func folderBytes(dir string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n, nil
}

func meanOf(ss []soakSample, f func(soakSample) float64) float64 {
	var sum float64
	for _, s := range ss {
		sum += f(s)
	}
	return sum / float64(len(ss))
}

func procStatusKB(pid int, field string) int {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 2 && fs[0] == field {
			n, _ := strconv.Atoi(fs[1])
			return n
		}
	}
	return 0
}

func countFDs(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}

// connsTo counts the established TCP connections of process pid to
// addr (host:port), from the sockets among its FDs.
func connsTo(pid int, addr string) int {
	port, err := strconv.ParseUint(addr[strings.LastIndexByte(addr, ':')+1:], 10, 16)
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, e := range ents {
		l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		if in, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(in, "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		for _, line := range strings.Split(string(b), "\n") {
			// sl local_address rem_address st ... inode
			fs := strings.Fields(line)
			if len(fs) < 10 || fs[3] != "01" || !inodes[fs[9]] {
				continue
			}
			if rp, err := strconv.ParseUint(fs[2][strings.LastIndexByte(fs[2], ':')+1:], 16, 16); err == nil && rp == port {
				n++
			}
		}
	}
	return n
}

// goroutines reads go_goroutines from Caddy's admin /metrics.
func goroutines(admin string) int {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return -1
}

func infoField(info, name string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
