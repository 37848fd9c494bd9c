// Package reliability is the evidence that sangho_dedup keeps its
// promise: no event processed twice, none lost, through Redis, backend
// and Caddy faults. Every test plays Sangho against real processes on
// 127.0.0.1 — Caddy built from ./cmd/caddy, redis-server (standalone,
// Cluster, Sentinel) and a backend that keeps a ledger — and prints its
// figures.
//
//	go test -race -count=1 ./reliability              # the CI size
//	RELIABILITY_SCALE=10 go test -count=1 -v ./reliability   # make reliability
package reliability

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/faultproxy"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

const secret = "whsec_reliability"

var caddyBin string

// scale multiplies the number of events (RELIABILITY_SCALE, default 1).
var scale = func() int {
	n, err := strconv.Atoi(os.Getenv("RELIABILITY_SCALE"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}()

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("reliability: -short leaves the suite out (it runs Caddy, Redis and faults as processes)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "sangho-reliability")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caddyBin = filepath.Join(dir, "caddy")
	build := exec.Command("go", "build", "-o", caddyBin, "../cmd/caddy")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building ./cmd/caddy:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// ---- Caddy processes ----

type caddyProc struct {
	url, admin string
	port       int
	cmd        *exec.Cmd
	exited     <-chan struct{}
	log        string
	cfg        string // the Caddyfile, kept for a restart on the same ports
	global     string // more global options (e.g. grace_period)
}

// siteConfig is the sangho_dedup block and reverse_proxy of a site;
// reverse_proxy gives up on a backend that has not answered in 1s.
func siteConfig(store, backend, extra string) string {
	return siteConfigTimeout(store, backend, extra, time.Second)
}

func siteConfigTimeout(store, backend, extra string, proxyTimeout time.Duration) string {
	lockTTL := "lock_ttl 2s"
	if strings.Contains(extra, "lock_ttl") {
		lockTTL = ""
	}
	return fmt.Sprintf(`	sangho_dedup {
		secret %s
		%s
		retry_after 1s
		%s
		%s
	}
	reverse_proxy %s {
		transport http {
			response_header_timeout %s
		}
	}`, secret, lockTTL, store, extra, backend, proxyTimeout)
}

func caddyfile(port, admin int, site string) string {
	return caddyfileGlobal(port, admin, "", site)
}

// caddyfileGlobal is caddyfile with more global options.
func caddyfileGlobal(port, admin int, global, site string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	%s
	auto_https off
	persist_config off
	# Caddy's own error log records request headers (for 5xx answers at
	# error level): drop the signature, as the README says.
	log {
		level WARN
		format filter {
			request>headers>Sangho-Signature delete
		}
	}
}
http://127.0.0.1:%d {
	bind 127.0.0.1
%s
}
`, admin, global, port, site)
}

func startCaddy(t *testing.T, site string) *caddyProc {
	t.Helper()
	return startCaddyGlobal(t, "", site)
}

// startCaddyGlobal is startCaddy with more global options.
func startCaddyGlobal(t *testing.T, global, site string) *caddyProc {
	t.Helper()
	// A port found free can be taken by another process before Caddy
	// binds it; then Caddy exits, and we try again with other ports.
	for attempt := 1; ; attempt++ {
		p, exited := tryStartCaddy(t, global, site)
		if !exited {
			return p
		}
		if attempt == 3 {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("caddy exited before listening, 3 times; last log:\n%s", b)
		}
	}
}

func tryStartCaddy(t *testing.T, global, site string) (*caddyProc, bool) {
	t.Helper()
	p := &caddyProc{port: netkit.FreePort(t), global: global}
	admin := netkit.FreePort(t)
	p.url = "http://127.0.0.1:" + strconv.Itoa(p.port) + "/webhook"
	p.admin = "127.0.0.1:" + strconv.Itoa(admin)
	dir := t.TempDir()
	p.cfg = filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(p.cfg, []byte(caddyfileGlobal(p.port, admin, global, site)), 0o600); err != nil {
		t.Fatal(err)
	}
	p.log = filepath.Join(dir, "caddy.log")
	t.Cleanup(p.kill)
	t.Cleanup(func() {
		b, _ := os.ReadFile(p.log)
		if bytes.Contains(b, []byte("v1=")) || bytes.Contains(b, []byte(secret)) {
			i := bytes.Index(b, []byte("v1="))
			t.Errorf("the log of Caddy on port %d holds a signature or the secret: ...%s", p.port, b[max(0, i-300):min(len(b), i+100)])
		}
		if t.Failed() {
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("last lines of the log of Caddy on port %d:\n%s", p.port, strings.Join(lines[max(0, len(lines)-8):], "\n"))
		}
	})
	return p, !p.launch(t)
}

// launch starts the Caddy process of p (again) and waits until it
// listens; it reports false if Caddy exited first.
func (p *caddyProc) launch(t *testing.T) bool {
	t.Helper()
	dir := filepath.Dir(p.cfg)
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	p.cmd = exec.Command(caddyBin, "run", "--config", p.cfg, "--adapter", "caddyfile")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(exited) }(p.cmd)
	p.exited = exited
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return false
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p.port), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			state, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
			t.Fatalf("caddy did not listen within 60s; log:\n%s\nprocess status:\n%s", b, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill sends SIGKILL: no graceful shutdown, leases in flight stay behind.
func (p *caddyProc) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		p.cmd = nil
	}
}

// terminate sends SIGTERM, Caddy's graceful stop, and waits for the
// process to exit (at most 60 s).
func (p *caddyProc) terminate(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	p.waitExit(t)
}

// stop runs `caddy stop` against the admin endpoint and waits for the
// process to exit (at most 60 s).
func (p *caddyProc) stop(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(caddyBin, "stop", "--address", p.admin).CombinedOutput(); err != nil {
		t.Fatalf("caddy stop: %v\n%s", err, out)
	}
	p.waitExit(t)
}

func (p *caddyProc) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		p.cmd = nil
	case <-time.After(60 * time.Second):
		t.Fatalf("caddy on port %d did not exit within 60s of being asked to stop", p.port)
	}
}

// restart starts Caddy again, after it exited, on the same ports with
// the same config.
func (p *caddyProc) restart(t *testing.T) {
	t.Helper()
	if !p.launch(t) {
		b, _ := os.ReadFile(p.log)
		t.Fatalf("caddy exited before listening again on port %d; log:\n%s", p.port, b)
	}
}

// reload loads a new site config through the admin API.
func (p *caddyProc) reload(site string) error {
	body := caddyfileGlobal(p.port, mustAtoi(p.admin[strings.LastIndexByte(p.admin, ':')+1:]), p.global, site)
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.admin+"/load", strings.NewReader(body))
	req.Header.Set("Content-Type", "text/caddyfile")
	// Caddy skips a /load of the config it already runs; this header
	// makes it reload all the same, so a reload fault is one.
	req.Header.Set("Cache-Control", "must-revalidate")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("reload: %d %s", resp.StatusCode, b)
	}
	return nil
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// ---- Sangho ----

// figures of one run.
type figures struct {
	events, deliveries, acked, duplicates, conflicts, unavailable, otherNon2xx, connErrors, retries atomic.Int64
	faults                                                                                          atomic.Int64
	noRetryAfter                                                                                    atomic.Int64 // 409s without Retry-After
	once, twice, lost                                                                               int
	recovery                                                                                        atomic.Int64 // ns from a fault's heal to the first 2xx of a new event; 0: not measured
	slowest                                                                                         atomic.Int64 // ns, the longest wait for an answer
	note                                                                                            string       // more figures, at the end of the line
}

func (f *figures) String() string {
	s := fmt.Sprintf("events %d, deliveries %d (retries %d), acknowledged %d, duplicates absorbed %d, 409 %d, 503 %d, other non-2xx %d, connection errors %d, faults injected %d; processed once %d, processed twice or more %d, lost %d",
		f.events.Load(), f.deliveries.Load(), f.retries.Load(), f.acked.Load(), f.duplicates.Load(), f.conflicts.Load(), f.unavailable.Load(),
		f.otherNon2xx.Load(), f.connErrors.Load(), f.faults.Load(), f.once, f.twice, f.lost)
	if r := f.recovery.Load(); r > 0 {
		s += fmt.Sprintf("; slowest answer %v; recovered %v after the heal",
			time.Duration(f.slowest.Load()).Round(time.Millisecond), time.Duration(r).Round(time.Millisecond))
	}
	if n := f.noRetryAfter.Load(); n > 0 {
		s += fmt.Sprintf("; 409 without Retry-After %d", n)
	}
	if f.note != "" {
		s += "; " + f.note
	}
	return s
}

// sender plays Sangho: every event is delivered `copies` times at once
// (duplicates on purpose) to random instances, and each delivery is
// retried after any non-2xx answer, timeout or connection error, with
// backoff, until acknowledged or until giveUp.
type sender struct {
	urls        []string
	copies      int
	concurrency int
	giveUp      time.Duration
	client      *http.Client
	fig         *figures
	pace        time.Duration // between two events (0: as fast as concurrency allows)

	ackMu sync.Mutex
	ackAt map[string]time.Time // when each event was first acknowledged
}

// ackedAt returns when id was first acknowledged (zero: never).
func (s *sender) ackedAt(id string) time.Time {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	return s.ackAt[id]
}

func newSender(urls []string, copies int) *sender {
	return &sender{
		urls: urls, copies: copies, concurrency: 48, giveUp: 30 * time.Second, fig: &figures{}, ackAt: map[string]time.Time{},
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}},
	}
}

// deliver sends one delivery until it is acknowledged; it reports
// whether it was.
func (s *sender) deliver(id string, body []byte, r *rand.Rand) bool {
	deadline := time.Now().Add(s.giveUp)
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.fig.retries.Add(1)
			time.Sleep(backoff + time.Duration(r.Int64N(int64(backoff))))
			backoff = min(2*backoff, 800*time.Millisecond)
		}
		if time.Now().After(deadline) {
			return false
		}
		url := s.urls[r.IntN(len(s.urls))]
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Sangho-Event-ID", id)
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), body, secret)) // signed afresh each attempt
		s.fig.deliveries.Add(1)
		sent := time.Now()
		resp, err := s.client.Do(req)
		for took := int64(time.Since(sent)); ; {
			if w := s.fig.slowest.Load(); took <= w || s.fig.slowest.CompareAndSwap(w, took) {
				break
			}
		}
		if err != nil {
			s.fig.connErrors.Add(1)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			if resp.Header.Get("Sangho-Dedup") == "duplicate" {
				s.fig.duplicates.Add(1)
			}
			return true
		case resp.StatusCode == 409:
			s.fig.conflicts.Add(1)
			if resp.Header.Get("Retry-After") == "" {
				s.fig.noRetryAfter.Add(1)
			}
		case resp.StatusCode == 503:
			s.fig.unavailable.Add(1)
		default:
			s.fig.otherNon2xx.Add(1)
		}
	}
}

// run delivers n events (each `copies` times) and returns their IDs and
// whether each was acknowledged at least once.
func (s *sender) run(prefix string, n int, during func(progress *atomic.Int64)) (ids []string, acked map[string]bool) {
	acked = map[string]bool{}
	var mu sync.Mutex
	sem := make(chan struct{}, s.concurrency)
	var wg sync.WaitGroup
	var progress atomic.Int64
	stop := make(chan struct{})
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		if during != nil {
			during(&progress)
		}
		<-stop
	}()
	for i := range n {
		id := fmt.Sprintf("evt_%s_%05d", prefix, i)
		ids = append(ids, id)
		body := []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded","data":{"object":{"n":%d}}}`, id, i))
		s.fig.events.Add(1)
		if s.pace > 0 && i > 0 {
			time.Sleep(s.pace)
		}
		for c := range s.copies {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				r := rand.New(rand.NewPCG(uint64(i), uint64(c)))
				if s.deliver(id, body, r) {
					at := time.Now()
					s.fig.acked.Add(1)
					mu.Lock()
					acked[id] = true
					mu.Unlock()
					s.ackMu.Lock()
					if _, ok := s.ackAt[id]; !ok {
						s.ackAt[id] = at
					}
					s.ackMu.Unlock()
				}
				progress.Add(1)
			}()
		}
	}
	wg.Wait()
	close(stop)
	<-faultsDone
	return ids, acked
}

// check compares the ledger with what Sangho saw, prints the figures,
// and fails the test if an event was lost, or processed twice unless
// doublesAllowed (a fault that breaks the promise by nature: then the
// figure is reported, not asserted).
func check(t *testing.T, name string, s *sender, l *ledger.Ledger, ids []string, acked map[string]bool, doublesAllowed bool) *figures {
	t.Helper()
	f := s.fig
	f.faults.Add(l.Faults())
	var twiceIDs, lostIDs []string
	for _, id := range ids {
		_, done := l.Counts(id)
		switch n := done; {
		case n == 1:
			f.once++
		case n > 1:
			f.twice++
			twiceIDs = append(twiceIDs, id)
		}
		if !acked[id] || done == 0 {
			f.lost++
			lostIDs = append(lostIDs, id)
		}
	}
	t.Logf("%s: %s", name, f)
	fmt.Printf("FIGURES %s: %s\n", name, f)
	if f.lost > 0 {
		t.Errorf("%d events lost (never acknowledged, or acknowledged but never processed), e.g. %v", f.lost, head(lostIDs))
	}
	if f.twice > 0 && !doublesAllowed {
		t.Errorf("%d events processed twice or more, e.g. %v", f.twice, head(twiceIDs))
	}
	if f.twice > 0 {
		// What each double was: a store that kept its promise processes
		// an event again only marked (a lease that ran out and was taken
		// over, or a delivery passed unchecked by on_store_error pass);
		// two unmarked processings would be a claim handed out twice.
		var unmarked []string
		for _, id := range twiceIDs {
			n := 0
			for _, d := range l.Deliveries(id) {
				if d.Done() && !d.Marked {
					n++
				}
			}
			if n > 1 {
				unmarked = append(unmarked, id)
			}
		}
		t.Logf("%s: of %d events processed twice, %d processed twice unmarked %v", name, f.twice, len(unmarked), head(unmarked))
		fmt.Printf("DOUBLES %s: %d twice, %d processed twice unmarked %v\n", name, f.twice, len(unmarked), head(unmarked))
	}
	return f
}

func head(s []string) []string {
	if len(s) > 5 {
		return s[:5]
	}
	return s
}

func redisStore(addrs ...string) string {
	return "store redis {\n\t\t\taddress " + strings.Join(addrs, " ") + "\n\t\t\tdial_timeout 300ms\n\t\t\tread_timeout 300ms\n\t\t}"
}

// startProxy starts a fault-injecting proxy to upstream, closed at
// cleanup.
func startProxy(t *testing.T, upstream string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(upstream)
	if err != nil {
		t.Fatalf("starting the fault proxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}
