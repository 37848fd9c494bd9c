package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

// -filescale serve: Caddy itself on a store (filled by -filescale
// fill), started in a fresh process with the store's files evicted from
// the page cache, then the seed's traffic for a while: how long until
// Caddy listens and answers, and its memory all along.

// serveConfig is what -filescale serve runs.
type serveConfig struct {
	caddy    string        // the Caddy binary (--caddy)
	env      []string      // extra environment of Caddy (the tests' re-exec)
	path     string        // the store (-filescale-path)
	warm     bool          // leave the store's files in the page cache
	duration time.Duration // of the traffic
	rate     float64       // events a second
	resend   float64       // share of the events that are resends of earlier ones
	sample   time.Duration // RSS sampling interval
}

// serveReport is what -filescale serve measured.
type serveReport struct {
	listen, firstAnswer time.Duration // from the start of `caddy run`
	rssOpen, hwmOpen    int           // KiB, once the first event is answered
	rss                 []int         // KiB, sampled during the traffic
	hwm                 int           // KiB, at the end
	sent                serveCounts
	loadStart, loadEnd  string // /proc/loadavg
}

// serveCounts are the answers of the traffic.
type serveCounts struct {
	newSent, resent int
	byStatus        map[string]int // "error": no answer
	wrong           int            // not 200, or a new event answered as a duplicate, or a resend passed on
	late            int            // events sent over a second after they were due (the driver fell behind)
	lat             []time.Duration
	seconds         float64
}

// serveEvent is an event once sent, for resends: its ID and its
// creation time (the body is rebuilt from them, the same bytes).
type serveEvent struct {
	id      string
	created int64
}

// serveBody is an event's body, shaped as the seed's example.
func serveBody(e serveEvent) []byte {
	return []byte(`{"id":"` + e.id + `","object":"event","type":"payment_intent.succeeded","created":` + strconv.FormatInt(e.created, 10) +
		`,"data":{"object":{"id":"pi_` + e.id[4:] + `","amount":2000,"currency":"eur"}}}`)
}

// serveDrive sends rate signed events a second to url for dur: new IDs,
// and a share resend of resends of events answered earlier in the run
// (picked uniformly, signed afresh, the same body). Every answer is
// checked: 200, with Sangho-Dedup: duplicate for a resend and without
// it for a new event.
func serveDrive(ctx context.Context, url string, rate, resend float64, dur time.Duration) serveCounts {
	client := load.Client(64, 30*time.Second)
	defer client.CloseIdleConnections()
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var mu sync.Mutex
	var done []serveEvent // answered, so that a resend finds it done
	c := serveCounts{byStatus: map[string]int{}}
	type job struct {
		n   int
		due time.Time
	}
	jobs := make(chan job, 1<<16)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for j := range jobs {
				mu.Lock()
				isResend := len(done) > 0 && r.Float64() < resend
				e := serveEvent{id: load.EventID(run, "n", 0, j.n), created: time.Now().Unix()}
				if isResend {
					e = done[r.IntN(len(done))]
				}
				mu.Unlock()
				body := serveBody(e)
				status, hdr, lat, err := load.Send(context.Background(), client, url, load.Delivery{ID: e.id, Body: body, Signature: sangho.Sign(time.Now(), body, secret)})
				mu.Lock()
				if time.Since(j.due)-lat > time.Second {
					c.late++
				}
				if isResend {
					c.resent++
				} else {
					c.newSent++
				}
				c.lat = append(c.lat, lat)
				switch {
				case err != nil:
					c.byStatus["error"]++
					c.wrong++
				default:
					c.byStatus[strconv.Itoa(status)]++
					if status != http.StatusOK || (hdr == "duplicate") != isResend {
						c.wrong++
					} else if !isResend {
						done = append(done, e)
					}
				}
				mu.Unlock()
			}
		}()
	}
	for n := 0; ; n++ {
		due := start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
		if due.Sub(start) >= dur {
			break
		}
		t := time.NewTimer(time.Until(due))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
		jobs <- job{n: n, due: due}
	}
	close(jobs)
	wg.Wait()
	c.seconds = time.Since(start).Seconds()
	slices.Sort(c.lat)
	return c
}

// serveCaddyfile is the config of -filescale serve: one site,
// sangho_dedup on the file store at path (its defaults otherwise),
// passing new events to backend.
func serveCaddyfile(port int, backend, path string) string {
	return fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n}\nhttp://127.0.0.1:%d {\n\tbind 127.0.0.1\n\tsangho_dedup {\n\t\tsecret %s\n\t\tstore file %s\n\t}\n\treverse_proxy %s\n}\n",
		port, secret, path, backend)
}

// fileScaleServe runs -filescale serve.
func fileScaleServe(cfg serveConfig) (serveReport, error) {
	var rep serveReport
	path, err := checkFileStore(cfg.path)
	if err != nil {
		return rep, err
	}
	if _, err := os.Stat(cfg.caddy); err != nil {
		return rep, fmt.Errorf("no Caddy binary at %s: build it with go build -o %s ./cmd/caddy", cfg.caddy, cfg.caddy)
	}
	tmp, err := os.MkdirTemp("", "sangho-bench-serve")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(tmp)

	// the backend: in this process
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, err
	}
	sink := load.NewSink("")
	go func() { _ = sink.Serve(bl) }()
	defer sink.Close()

	port := freePort()
	cfgPath := filepath.Join(tmp, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(serveCaddyfile(port, bl.Addr().String(), path)), 0o600); err != nil {
		return rep, err
	}
	dir := filestore.StoreDir(path)
	if !cfg.warm {
		n, err := evict(dir)
		if err != nil {
			return rep, err
		}
		resident, pages := residentPages(dir)
		fmt.Fprintf(os.Stderr, "evicted %d files of %s from the page cache (posix_fadvise DONTNEED; mincore: %d of %d pages resident after)\n", n, dir, resident, pages)
		if resident > 0 {
			return rep, fmt.Errorf("%d pages of %s are still in the page cache after the eviction: the start would not be cold (a file system without a page cache, such as tmpfs?)", resident, dir)
		}
	}
	rep.loadStart = loadAvg()

	logPath := filepath.Join(tmp, "caddy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return rep, err
	}
	defer logf.Close()
	cmd := exec.Command(cfg.caddy, "run", "--config", cfgPath, "--adapter", "caddyfile")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(append(os.Environ(), "XDG_DATA_HOME="+tmp, "XDG_CONFIG_HOME="+tmp), cfg.env...)
	exited := make(chan struct{})
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return rep, err
	}
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	failed := func(err error) (serveReport, error) {
		log, _ := os.ReadFile(logPath)
		return rep, fmt.Errorf("%v\nCaddy's log:\n%s", err, log)
	}

	// listening: a TCP connection accepted
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			rep.listen = time.Since(t0)
			break
		}
		select {
		case <-exited:
			return failed(errors.New("caddy run exited before it listened"))
		case <-time.After(2 * time.Millisecond):
		}
		if time.Since(t0) > 10*time.Minute {
			return failed(errors.New("caddy did not listen within 10 minutes"))
		}
	}
	// the first signed event answered correctly
	url := "http://" + addr + "/"
	client := load.Client(1, 30*time.Second)
	e := serveEvent{id: "evt_first_" + strconv.FormatInt(time.Now().UnixNano(), 36), created: time.Now().Unix()}
	body := serveBody(e)
	status, hdr, _, err := load.Send(context.Background(), client, url, load.Delivery{ID: e.id, Body: body, Signature: sangho.Sign(time.Now(), body, secret)})
	client.CloseIdleConnections()
	if err != nil || status != http.StatusOK || hdr != "" {
		return failed(fmt.Errorf("the first event: status %d, Sangho-Dedup %q, %v", status, hdr, err))
	}
	rep.firstAnswer = time.Since(t0)
	pid := cmd.Process.Pid
	rep.rssOpen, rep.hwmOpen = memKB(pid)
	fmt.Fprintf(os.Stderr, "listening after %v, the first event answered after %v, RSS %d MiB; now %.0f events/s for %v\n",
		rep.listen.Round(time.Millisecond), rep.firstAnswer.Round(time.Millisecond), rep.rssOpen/1024, cfg.rate, cfg.duration)

	// the traffic, Caddy's memory sampled meanwhile
	stop := make(chan struct{})
	sampled := tickUntil(cfg.sample, stop, func() error {
		if rss, _ := memKB(pid); rss > 0 {
			rep.rss = append(rep.rss, rss)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	rep.sent = serveDrive(ctx, url, cfg.rate, cfg.resend, cfg.duration)
	cancel()
	close(stop)
	_ = sampled()
	var rss int
	rss, rep.hwm = memKB(pid)
	rep.rss = append(rep.rss, rss)
	rep.loadEnd = loadAvg()
	select {
	case <-exited:
		return failed(errors.New("caddy exited during the traffic"))
	default:
	}
	return rep, nil
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// String is the report of -filescale serve.
func (r serveReport) String() string {
	var b strings.Builder
	mib := func(kb int) string { return fmt.Sprintf("%.0f MiB", float64(kb)/1024) }
	fmt.Fprintf(&b, "caddy run: listening after %v; the first signed event answered after %v (both from the process start)\n",
		r.listen.Round(time.Millisecond), r.firstAnswer.Round(time.Millisecond))
	fmt.Fprintf(&b, "RSS after the open (the first answer): %s (VmHWM %s)\n", mib(r.rssOpen), mib(r.hwmOpen))
	if len(r.rss) > 0 {
		s := slices.Sorted(slices.Values(r.rss))
		fmt.Fprintf(&b, "RSS during the traffic, %d samples: median %s, max %s; VmHWM at the end %s\n", len(s), mib(s[len(s)/2]), mib(s[len(s)-1]), mib(r.hwm))
	}
	c := r.sent
	n := c.newSent + c.resent
	fmt.Fprintf(&b, "events: %d in %.0f s (%.1f/s): %d new, %d resends of earlier ones; answers %s; wrong answers %d; sent over 1 s late %d\n",
		n, c.seconds, float64(n)/max(c.seconds, 1e-9), c.newSent, c.resent, counts(c.byStatus), c.wrong, c.late)
	if len(c.lat) > 0 {
		q := func(p float64) time.Duration { return c.lat[min(len(c.lat)-1, int(p*float64(len(c.lat))))] }
		fmt.Fprintf(&b, "latency: p50 %v, p99 %v, max %v\n", q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), c.lat[len(c.lat)-1].Round(time.Microsecond))
	}
	fmt.Fprintf(&b, "load average: %s at the start, %s at the end\n", r.loadStart, r.loadEnd)
	return b.String()
}

// counts renders answers by status, sorted.
func counts(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
