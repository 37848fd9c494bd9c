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

	"github.com/sangho/caddy-sangho-dedup/internal/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/redistest"
)

// soakTarget is one Caddy under soak, with its store and ledger.
type soakTarget struct {
	name   string
	site   string
	p      *caddyProc
	l      *ledger.Ledger
	s      *sender
	redis  *redis.Client // Redis target only
	dbFile string        // file target only

	mu      sync.Mutex
	ids     []string
	acked   map[string]bool
	samples []soakSample
}

type soakSample struct {
	at                     time.Duration
	rssMiB                 float64
	goroutines, fds        int
	storeMiB               float64 // Redis used_memory, or the file's size
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
	extra := "retention " + retention.String()
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
			tg.dbFile = filepath.Join(filepath.Dir(tg.p.cfg), "caddy", "sangho_dedup", "dedup.db")
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
// 500 for a second, Redis is paused for a second, each Caddy reloads.
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

// sample records the process and store figures every 10 s.
func (tg *soakTarget) sample(ctx context.Context, start time.Time) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pid := tg.p.cmd.Process.Pid
		s := soakSample{at: time.Since(start).Round(time.Second), rssMiB: float64(procStatusKB(pid, "VmRSS:")) / 1024,
			goroutines: goroutines(tg.p.admin), fds: countFDs(pid),
			events: tg.s.fig.events.Load(), acked: tg.s.fig.acked.Load(), retried: tg.s.fig.retries.Load()}
		if tg.redis != nil {
			info, _ := tg.redis.Info(context.Background(), "memory").Result()
			s.storeMiB = float64(infoField(info, "used_memory")) / (1 << 20)
			n, _ := tg.redis.DBSize(context.Background()).Result()
			s.keys = int(n)
		} else if fi, err := os.Stat(tg.dbFile); err == nil {
			s.storeMiB = float64(fi.Size()) / (1 << 20)
			s.keys = -1
		}
		tg.mu.Lock()
		tg.samples = append(tg.samples, s)
		tg.mu.Unlock()
	}
}

// report prints the samples and fails if a figure trends upward once
// the retention window is full: the mean of the last third of the
// steady-state samples against the first third.
func (tg *soakTarget) report(t *testing.T, retention time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "soak %s:\n| t | RSS MiB | goroutines | FDs | store MiB | keys | events | acked |\n", tg.name)
	var steady []soakSample
	for _, s := range tg.samples {
		keys := strconv.Itoa(s.keys)
		if s.keys < 0 {
			keys = "-" // the file is locked by Caddy: its size is the figure
		}
		fmt.Fprintf(&b, "| %v | %.1f | %d | %d | %.2f | %s | %d | %d |\n", s.at, s.rssMiB, s.goroutines, s.fds, s.storeMiB, keys, s.events, s.acked)
		if s.at > 2*retention {
			steady = append(steady, s)
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
		{"goroutines", func(s soakSample) float64 { return float64(s.goroutines) }, 20},
		{"open FDs", func(s soakSample) float64 { return float64(s.fds) }, 10},
		{"store MiB", func(s soakSample) float64 { return s.storeMiB }, 0.5},
		{"keys", func(s soakSample) float64 { return float64(s.keys) }, 200},
	} {
		a, z := meanOf(first, m.get), meanOf(last, m.get)
		if z > a*1.15+m.slack {
			t.Errorf("soak %s: %s trends upward once the retention window is full: %.1f in the first third of the steady state, %.1f in the last", tg.name, m.name, a, z)
		}
	}
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
