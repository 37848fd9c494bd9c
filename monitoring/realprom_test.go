package monitoring

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/faultproxy"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/pgtest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// The real-Prometheus test: one Caddy built from ./cmd/caddy, with
// sangho_dedup on the file store, on Redis (several endpoints, some
// broken on purpose) and on PostgreSQL (a role without the privileges),
// Caddy's tracing on and an access log written as the
// docs/observability.md says, scraped every second by Debian's prometheus loaded with
// the rule file, while deliveries of every outcome arrive. Then every
// PromQL expression of the dashboard and of the rule file is evaluated
// through Prometheus's HTTP API. Everything listens on 127.0.0.1.

const secret = "whsec_monitoring_test"

// rateInterval stands for Grafana's $__rate_interval in instant queries:
// the whole test fits in it.
const rateInterval = "1m"

type fleet struct {
	dir                 string
	site, admin, prom   string // base URLs
	metricsAddr         string
	caddyOut, accessLog string
	caddy               *exec.Cmd
	start               time.Time
	commitProxy         *faultproxy.Proxy
	be                  *backend
}

func freePort(t *testing.T) int { return netkit.FreePort(t) }

// recipe returns the code block that follows the marker
// <!-- test: NAME --> in a Markdown file (docs/observability.md, or
// README.md here).
func recipe(t *testing.T, readme, name string) string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "<!-- test: "+name+" -->")
	if i < 0 {
		t.Fatalf("%s has no recipe marked %q", readme, name)
	}
	s = s[i:]
	start := strings.Index(s, "```")
	s = s[start:]
	s = s[strings.IndexByte(s, '\n')+1:]
	return s[:strings.Index(s, "```")]
}

func buildCaddy(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "caddy")
	out, err := exec.Command("go", "build", "-o", bin, "../cmd/caddy").CombinedOutput()
	if err != nil {
		t.Fatalf("building ./cmd/caddy: %v\n%s", err, out)
	}
	return bin
}

// backend answers by event: evt_fail* 500, evt_held* after Caddy's
// proxy timeout, evt_lease* once released, evt_commit* after cutting
// the commit store off, the rest 200.
type backend struct {
	url     string
	arrived sync.Map // event ID → chan struct{}, closed when it arrives
	release chan struct{}
	cut     func()
}

var idRe = regexp.MustCompile(`"id":"([A-Za-z0-9_-]+)"`)

func (b *backend) arrivedCh(id string) chan struct{} {
	ch, _ := b.arrived.LoadOrStore(id, make(chan struct{}))
	return ch.(chan struct{})
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := ""
	if m := idRe.FindSubmatch(body); m != nil {
		id = string(m[1])
	}
	ch := b.arrivedCh(id)
	select {
	case <-ch:
	default:
		close(ch)
	}
	switch {
	case strings.HasPrefix(id, "evt_fail"):
		w.WriteHeader(http.StatusInternalServerError)
		return
	case strings.HasPrefix(id, "evt_held"):
		time.Sleep(1500 * time.Millisecond) // past response_header_timeout
	case strings.HasPrefix(id, "evt_lease"):
		<-b.release
	case strings.HasPrefix(id, "evt_commit"):
		b.cut()
	}
	w.WriteHeader(http.StatusOK)
}

func startBackend(t *testing.T) *backend {
	b := &backend{release: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: b}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	b.url = "http://" + ln.Addr().String()
	return b
}

func endpoint(name, extra, backend string) string {
	return fmt.Sprintf(`	handle /%[1]s/* {
		sangho_dedup {
			secret %[2]s
			name %[1]s
			key_prefix "%[1]s:"
			lock_ttl 3s
			retry_after 1s
			max_body_size 4096
			%[3]s
		}
		reverse_proxy %[4]s {
			transport http {
				response_header_timeout 1s
			}
		}
	}
`, name, secret, extra, backend)
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	prometheus := tool(t, "prometheus")
	f := &fleet{dir: t.TempDir()}
	bin := buildCaddy(t, f.dir)

	// Redis: one healthy, one that may evict keys. Users of the healthy
	// one: one without PEXPIRE (the store refuses to start claiming),
	// one without CLIENT TRACKING (no local cache).
	main := redistest.Start(t)
	evict := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	admin := main.Client(t)
	for _, acl := range [][]any{
		{"ACL", "SETUSER", "nopexpire", "on", ">pw_nopexpire", "~*", "&*", "+@all", "-pexpire"},
		{"ACL", "SETUSER", "notrack", "on", ">pw_notrack", "~*", "&*", "+@all", "-client|tracking"},
	} {
		if err := admin.Do(context.Background(), acl...).Err(); err != nil {
			t.Fatalf("%v: %v", acl, err)
		}
	}
	slow, err := faultproxy.Start(main.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	slow.SetLatency(60 * time.Millisecond)
	if f.commitProxy, err = faultproxy.Start(main.Addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.commitProxy.Close() })
	be := startBackend(t)
	be.cut = func() { f.commitProxy.BlackHole(true) }
	f.be = be
	dead := "127.0.0.1:" + strconv.Itoa(freePort(t)) // nothing listens there

	// PostgreSQL: a role granted nothing, so the store cannot create its
	// table (PostgreSQL 15 revokes CREATE on public from PUBLIC): every
	// claim is a permission_missing problem, answered 503.
	pg := pgtest.Start(t)
	pg.Psql(t, "CREATE ROLE caddy_nogrant LOGIN")
	pgNoGrant := pg.DSNAs("caddy_nogrant", "")

	sitePort, adminPort, metricsPort, promPort := freePort(t), freePort(t), freePort(t), freePort(t)
	f.site = "http://127.0.0.1:" + strconv.Itoa(sitePort)
	f.admin = "http://127.0.0.1:" + strconv.Itoa(adminPort)
	f.metricsAddr = "127.0.0.1:" + strconv.Itoa(metricsPort)
	f.prom = "http://127.0.0.1:" + strconv.Itoa(promPort)
	f.accessLog = filepath.Join(f.dir, "access.log")

	redis := func(addr, more string) string {
		return "store redis {\n\t\t\t\taddress " + addr + "\n\t\t\t\tdial_timeout 200ms\n\t\t\t\tread_timeout 500ms\n\t\t\t\t" + more + "\n\t\t\t}"
	}
	accessLog := strings.ReplaceAll(recipe(t, "../docs/observability.md", "access-log"), "/var/log/caddy/webhooks.log", f.accessLog)
	tracing := recipe(t, "../docs/observability.md", "tracing")
	metricsSite := strings.Replace(recipe(t, "../docs/observability.md", "metrics-site"), ":9180 {", "http://"+f.metricsAddr+" {\n\tbind 127.0.0.1", 1)
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	log {
		format filter {
			request>headers>Sangho-Signature delete
		}
	}
}
%s
http://127.0.0.1:%d {
	bind 127.0.0.1
%s%s`, adminPort, metricsSite, sitePort, tracing, accessLog)
	for _, e := range []struct{ name, extra string }{
		{"payments_file", "store file " + filepath.Join(f.dir, "dedup.db")},
		{"payments_redis", redis(main.Addr, "")},
		{"down", redis(dead, "")},
		{"pass", redis(dead, "") + "\n\t\t\ton_store_error pass"},
		{"slow", redis(slow.Addr(), "")},
		{"commit", redis(f.commitProxy.Addr(), "")},
		{"replicas", redis(main.Addr, "wait_replicas 1\n\t\t\t\twait_timeout 50ms")},
		{"acl", redis(main.Addr, "username nopexpire\n\t\t\t\tpassword pw_nopexpire")},
		{"notrack", redis(main.Addr, "username notrack\n\t\t\t\tpassword pw_notrack\n\t\t\t\tlocal_cache 10000")},
		{"evict", redis(evict.Addr, "")},
		{"pg_acl", "store postgres {\n\t\t\t\tdsn \"" + pgNoGrant + "\"\n\t\t\t}"},
	} {
		cfg += endpoint(e.name, e.extra, be.url)
	}
	cfg += "}\n"
	caddyfile := filepath.Join(f.dir, "Caddyfile")
	if err := os.WriteFile(caddyfile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	f.caddyOut = filepath.Join(f.dir, "caddy.stdout")
	stdout, _ := os.Create(f.caddyOut)
	stderr, _ := os.Create(filepath.Join(f.dir, "caddy.stderr"))
	f.caddy = exec.Command(bin, "run", "--config", caddyfile, "--adapter", "caddyfile")
	f.caddy.Stdout, f.caddy.Stderr = stdout, stderr
	// Caddy's tracing exports through OpenTelemetry's environment: the
	// console exporter writes the spans to standard output as JSON.
	f.caddy.Env = append(os.Environ(), "HOME="+f.dir, "XDG_DATA_HOME="+f.dir, "XDG_CONFIG_HOME="+f.dir,
		"OTEL_TRACES_EXPORTER=console", "OTEL_BSP_SCHEDULE_DELAY=200", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none")
	if err := f.caddy.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = f.caddy.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = f.caddy.Process.Signal(syscall.SIGKILL)
		<-exited
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(f.dir, "caddy.stderr"))
			t.Logf("Caddy's log:\n%s", tail(string(b), 30))
		}
	})
	waitFor(t, 60*time.Second, "Caddy listening", func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(f.dir, "caddy.stderr"))
			t.Fatalf("caddy exited:\n%s\nconfig:\n%s", tail(string(b), 30), cfg)
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(sitePort), 200*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// Prometheus: the README's scrape config and rule file, every second.
	promCfg := recipe(t, "README.md", "prometheus")
	abs, _ := filepath.Abs(rulesFile)
	promCfg = strings.ReplaceAll(promCfg, "/etc/prometheus/sangho-dedup.rules.yml", abs)
	promCfg = strings.ReplaceAll(promCfg, "caddy.internal:9180", f.metricsAddr)
	promCfg = "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n" + promCfg
	promFile := filepath.Join(f.dir, "prometheus.yml")
	if err := os.WriteFile(promFile, []byte(promCfg), 0o600); err != nil {
		t.Fatal(err)
	}
	plog, _ := os.Create(filepath.Join(f.dir, "prometheus.log"))
	pcmd := exec.Command(prometheus, "--config.file="+promFile, "--storage.tsdb.path="+filepath.Join(f.dir, "tsdb"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(promPort), "--log.level=warn")
	pcmd.Stdout, pcmd.Stderr = plog, plog
	if err := pcmd.Start(); err != nil {
		t.Fatal(err)
	}
	pexited := make(chan struct{})
	go func() { _ = pcmd.Wait(); close(pexited) }()
	t.Cleanup(func() {
		_ = pcmd.Process.Signal(syscall.SIGKILL)
		<-pexited
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(f.dir, "prometheus.log"))
			t.Logf("Prometheus's log:\n%s", tail(string(b), 20))
		}
	})
	waitFor(t, 30*time.Second, "Prometheus scraping Caddy", func() bool {
		select {
		case <-pexited:
			b, _ := os.ReadFile(filepath.Join(f.dir, "prometheus.log"))
			t.Fatalf("prometheus exited:\n%s", b)
		default:
		}
		res, err := f.query(`up{job="caddy"} == 1 and on() count(caddy_sangho_dedup_events_total) > 0`, time.Time{})
		return err == nil && len(res) > 0
	})
	f.start = time.Now()
	return f
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", within, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type sample struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
	Values [][]any           `json:"values"`
}

// query evaluates expr at at (zero: now) through /api/v1/query.
func (f *fleet) query(expr string, at time.Time) ([]sample, error) {
	v := url.Values{"query": {expr}}
	if !at.IsZero() {
		v.Set("time", strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64))
	}
	return f.api("/api/v1/query?" + v.Encode())
}

// queryRange evaluates expr from start to end, one point a second.
func (f *fleet) queryRange(expr string, start, end time.Time) ([]sample, error) {
	v := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)},
		"end": {strconv.FormatInt(end.Unix(), 10)}, "step": {"1"}}
	return f.api("/api/v1/query_range?" + v.Encode())
}

func (f *fleet) api(path string) ([]sample, error) {
	resp, err := http.Get(f.prom + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Status    string `json:"status"`
		Error     string `json:"error"`
		ErrorType string `json:"errorType"`
		Data      struct {
			Result []sample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("%s: %d, %v", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s", r.ErrorType, r.Error)
	}
	return r.Data.Result, nil
}

type delivery struct {
	status int
	dedup  string
}

// deliver posts body to an endpoint, signed with secret ("" leaves the
// signature out).
func (f *fleet) deliver(t *testing.T, endpoint, body, sec string) delivery {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.site+"/"+endpoint+"/webhook", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sec != "" {
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), sec))
	}
	c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("delivery to %s: %v", endpoint, err)
		return delivery{}
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return delivery{resp.StatusCode, resp.Header.Get("Sangho-Dedup")}
}

// waitArrived waits until the backend got the event (at most 10 s).
func (f *fleet) waitArrived(t *testing.T, id string) bool {
	select {
	case <-f.be.arrivedCh(id):
		return true
	case <-time.After(10 * time.Second):
		t.Errorf("%s never reached the backend", id)
		return false
	}
}

func event(id string) string {
	return `{"id":"` + id + `","object":"event","type":"invoice.paid","data":{"object":{"amount":2000}}}`
}

// deliverEveryOutcome sends deliveries of every outcome and checks each
// answer, so that every series of the dashboard and the rules exists.
func (f *fleet) deliverEveryOutcome(t *testing.T) {
	t.Helper()
	be := f.be
	want := func(what string, got delivery, status int) {
		t.Helper()
		if got.status != status {
			t.Errorf("%s: %d, want %d", what, got.status, status)
		}
	}
	for i := 1; i <= 5; i++ {
		want("processed (file)", f.deliver(t, "payments_file", event(fmt.Sprintf("evt_ok_%d", i)), secret), 200)
		want("processed (redis)", f.deliver(t, "payments_redis", event(fmt.Sprintf("evt_ok_%d", i)), secret), 200)
	}
	for range 3 {
		want("duplicate (file)", f.deliver(t, "payments_file", event("evt_ok_1"), secret), 200)
		want("duplicate (redis)", f.deliver(t, "payments_redis", event("evt_ok_1"), secret), 200)
	}
	want("payload mismatch", f.deliver(t, "payments_file", `{"id":"evt_ok_2","type":"invoice.paid","changed":true}`, secret), 422)
	want("released", f.deliver(t, "payments_file", event("evt_fail_1"), secret), 500) // the backend's answer
	want("released (redis)", f.deliver(t, "payments_redis", event("evt_fail_1"), secret), 500)
	want("bad request", f.deliver(t, "payments_file", `{"type":"no id"}`, secret), 400)
	want("too large", f.deliver(t, "payments_file", `{"id":"evt_big","pad":"`+strings.Repeat("x", 5000)+`"}`, secret), 413)
	for i := range 40 {
		want("bad signature", f.deliver(t, "payments_file", event(fmt.Sprintf("evt_forged_%d", i)), "whsec_not_the_secret"), 401)
	}
	for i := range 5 {
		want("no signature", f.deliver(t, "payments_redis", event(fmt.Sprintf("evt_unsigned_%d", i)), ""), 401)
	}
	for i := range 3 {
		want("store error", f.deliver(t, "down", event(fmt.Sprintf("evt_down_%d", i)), secret), 503)
	}
	for i := range 2 {
		want("unchecked", f.deliver(t, "pass", event(fmt.Sprintf("evt_pass_%d", i)), secret), 200)
	}
	want("permission missing", f.deliver(t, "acl", event("evt_acl_1"), secret), 503)
	want("postgres permission missing", f.deliver(t, "pg_acl", event("evt_pg_acl_1"), secret), 503)
	want("processed without local cache", f.deliver(t, "notrack", event("evt_notrack_1"), secret), 200)
	want("processed on an evicting Redis", f.deliver(t, "evict", event("evt_evict_1"), secret), 200)
	for i := range 2 {
		want("unreplicated", f.deliver(t, "replicas", event(fmt.Sprintf("evt_repl_%d", i)), secret), 200)
	}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() { want("slow store", f.deliver(t, "slow", event(fmt.Sprintf("evt_slow_%d", i)), secret), 200) })
	}

	// Held, and a redelivery meeting it in flight (409).
	held := make(chan delivery, 1)
	go func() { held <- f.deliver(t, "payments_file", event("evt_held_1"), secret) }()
	if !f.waitArrived(t, "evt_held_1") {
		t.FailNow()
	}
	want("in flight", f.deliver(t, "payments_file", event("evt_held_1"), secret), 409)
	want("held", <-held, 504) // reverse_proxy's timeout

	// A lease taken away while the backend works (forget --force).
	lease := make(chan delivery, 1)
	go func() { lease <- f.deliver(t, "payments_file", event("evt_lease_1"), secret) }()
	if !f.waitArrived(t, "evt_lease_1") {
		t.FailNow()
	}
	req, _ := http.NewRequest(http.MethodDelete, f.admin+"/sangho_dedup/payments_file/events/evt_lease_1?force=true", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("forget --force: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	close(be.release)
	want("lease lost", <-lease, 200)

	// A commit that fails after the backend's 2xx: the store is cut off
	// (black hole) and stays so, so the commit is retried in the
	// background until the test ends.
	want("commit retried", f.deliver(t, "commit", event("evt_commit_1"), secret), 200)
	wg.Wait()
}

// TestRealCaddyAndPrometheus: see the top of this file. Its subtests
// share one Caddy and one Prometheus.
func TestRealCaddyAndPrometheus(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Caddy, Redis and Prometheus")
	}
	began := time.Now()
	f := startFleet(t)
	t.Logf("Caddy built and started, Prometheus scraping it: %v", time.Since(began).Round(time.Millisecond))
	f.deliverEveryOutcome(t)
	// Prometheus has the state of now once it scraped after the last
	// delivery: the commit retry pending is the last thing to appear.
	total := f.scrapeTotal(t)
	waitFor(t, 20*time.Second, "Prometheus scraping the deliveries", func() bool {
		res, err := f.query(fmt.Sprintf(`sum(caddy_sangho_dedup_events_total) >= %v and on() sum(caddy_sangho_dedup_commit_retries_pending) > 0`, total), time.Time{})
		return err == nil && len(res) == 1
	})
	t.Logf("deliveries of every outcome sent and scraped: %v", time.Since(began).Round(time.Millisecond))
	if t.Failed() {
		t.FailNow()
	}

	t.Run("exporter", func(t *testing.T) { f.checkExporter(t) })
	t.Run("rules loaded", func(t *testing.T) { f.checkRulesLoaded(t) })
	t.Run("dashboard queries", func(t *testing.T) { f.checkDashboardQueries(t) })
	t.Run("rule queries", func(t *testing.T) { f.checkRuleQueries(t) })
	t.Run("alerts", func(t *testing.T) { f.checkAlerts(t) })
	t.Run("access log", func(t *testing.T) { f.checkAccessLog(t) })
	t.Run("traces", func(t *testing.T) { f.checkTraces(t) })
	if os.Getenv("MONITORING_PANELS") == "write" {
		// For the pictures: a longer run of mixed traffic first.
		f.traffic(t, 90*time.Second)
	}
	t.Run("panels", func(t *testing.T) { f.renderPanels(t) })
	t.Logf("whole test: %v", time.Since(began).Round(time.Millisecond))
}

// scrape reads Caddy's metrics endpoint: series → value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func (f *fleet) scrapeTotal(t *testing.T) float64 {
	var total float64
	for k, v := range scrape(t, "http://"+f.metricsAddr+"/metrics") {
		if strings.HasPrefix(k, "caddy_sangho_dedup_events_total{") {
			total += v
		}
	}
	return total
}

// family is a series' metric family: its name without the histogram
// suffixes.
func family(series string) string {
	name := series
	if i := strings.IndexByte(name, '{'); i >= 0 {
		name = name[:i]
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if strings.HasSuffix(name, suf) && strings.Contains(name, "_duration_seconds") {
			return strings.TrimSuffix(name, suf)
		}
	}
	return name
}

// checkExporter: the metrics site of docs/observability.md and Caddy's
// admin endpoint both serve every series of its metric table, and no
// other of this module.
func (f *fleet) checkExporter(t *testing.T) {
	table := docsMetricTable(t)
	for _, u := range []string{"http://" + f.metricsAddr + "/metrics", f.admin + "/metrics"} {
		got := map[string]bool{}
		for k := range scrape(t, u) {
			if strings.HasPrefix(k, "caddy_sangho_dedup_") {
				got[family(k)] = true
			}
		}
		for name := range table {
			if !got[name] {
				t.Errorf("%s does not serve %s", u, name)
			}
		}
		for name := range got {
			if _, ok := table[name]; !ok {
				t.Errorf("%s serves %s, which the table of docs/observability.md lacks", u, name)
			}
		}
	}
}

// checkRulesLoaded: the real Prometheus loaded the rule file, and
// evaluates every rule without error.
func (f *fleet) checkRulesLoaded(t *testing.T) {
	resp, err := http.Get(f.prom + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				}
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range r.Data.Groups {
		for _, rl := range g.Rules {
			n++
			if rl.Health != "ok" {
				t.Errorf("rule %s: health %q %s", rl.Name, rl.Health, rl.LastError)
			}
		}
	}
	if want := len(loadRules(t)); n != want {
		t.Errorf("Prometheus loaded %d rules, want %d", n, want)
	}
}

// grafana substitutes the dashboard's variables as Grafana would with
// every instance and endpoint selected.
func grafana(expr, rateInterval string) string {
	return strings.NewReplacer("$__rate_interval", rateInterval, "$instance", ".*", "$endpoint", ".*").Replace(expr)
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*(\w+)\)$`)

// checkDashboardQueries: every expression of the dashboard — each
// panel's targets and each variable's label_values — parses and
// returns series.
func (f *fleet) checkDashboardQueries(t *testing.T) {
	d := loadDashboard(t)
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			n++
			res, err := f.query(grafana(tg.Expr, rateInterval), time.Time{})
			if err != nil {
				t.Errorf("panel %q, %s: %v", p.Title, tg.RefID, err)
			} else if len(res) == 0 {
				t.Errorf("panel %q, %s: no series for %s", p.Title, tg.RefID, tg.Expr)
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(series, label)", v.Name, v.Definition)
			continue
		}
		n++
		res, err := f.query(fmt.Sprintf("count by (%s) (%s)", m[2], grafana(m[1], rateInterval)), time.Time{})
		if err != nil || len(res) == 0 {
			t.Errorf("variable %s: %v, %d values", v.Name, err, len(res))
		}
		if v.Name == "endpoint" && len(res) != 11 {
			t.Errorf("variable endpoint: %d values, want the 11 endpoints: %v", len(res), res)
		}
	}
	t.Logf("%d dashboard expressions evaluated", n)
}

// comparison is the threshold at the end of an alert's expression.
var comparison = regexp.MustCompile(`\s*(>|>=|<|<=|==|!=)\s*[0-9.]+$`)

// notInduced are the alerts whose condition this test does not bring
// about, with why; their expression must parse, and without its
// threshold return series.
var notInduced = map[string]string{
	"SanghoDedupCommitAbandoned": "a commit is abandoned after 5 minutes of retries",
}

// checkRuleQueries: every alert expression parses; its left-hand side
// (the expression without the threshold) returns series; and the whole
// expression returns series, since the test brought about every
// condition but those in notInduced: each rule matches what the real
// exporter serves.
func (f *fleet) checkRuleQueries(t *testing.T) {
	for _, r := range loadRules(t) {
		lhs := comparison.ReplaceAllString(r.Expr, "")
		if lhs == r.Expr {
			t.Errorf("%s: no threshold at the end of %s", r.Alert, r.Expr)
		}
		if res, err := f.query(lhs, time.Time{}); err != nil || len(res) == 0 {
			t.Errorf("%s: %s: %v, %d series", r.Alert, lhs, err, len(res))
		}
		res, err := f.query(r.Expr, time.Time{})
		switch {
		case err != nil:
			t.Errorf("%s: %v", r.Alert, err)
		case notInduced[r.Alert] == "" && len(res) == 0:
			t.Errorf("%s: the condition was brought about but %s returns no series", r.Alert, r.Expr)
		}
	}
}

// checkAlerts: Prometheus, evaluating the rule file every second, has
// every alert the test brought about pending or firing.
func (f *fleet) checkAlerts(t *testing.T) {
	want := map[string]bool{}
	for _, r := range loadRules(t) {
		if notInduced[r.Alert] == "" {
			want[r.Alert] = true
		}
	}
	var missing []string
	waitFor(t, 15*time.Second, "the alerts", func() bool {
		res, err := f.query("ALERTS", time.Time{})
		if err != nil {
			return false
		}
		got := map[string]bool{}
		for _, s := range res {
			got[s.Metric["alertname"]] = true
		}
		missing = missing[:0]
		for a := range want {
			if !got[a] {
				missing = append(missing, a)
			}
		}
		return len(missing) == 0
	})
}

// checkAccessLog: the access-log recipe of docs/observability.md puts
// the outcome and the event ID of each delivery into Caddy's access log,
// and no signature.
func (f *fleet) checkAccessLog(t *testing.T) {
	var entries []map[string]any
	waitFor(t, 10*time.Second, "the access log", func() bool {
		b, err := os.ReadFile(f.accessLog)
		if err != nil {
			return false
		}
		if bytes.Contains(b, []byte("v1=")) || bytes.Contains(b, []byte("Sangho-Signature")) {
			t.Fatalf("the access log holds a signature")
		}
		entries = entries[:0]
		for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			var e map[string]any
			if json.Unmarshal(line, &e) == nil {
				entries = append(entries, e)
			}
		}
		return len(entries) > 60
	})
	type key struct{ id, outcome string }
	count := map[key]int{}
	for _, e := range entries {
		id, _ := e["event_id"].(string)
		oc, _ := e["dedup_outcome"].(string)
		count[key{id, oc}]++
		if oc == "invalid_signature" && id != "" {
			t.Errorf("an event ID for a refused signature: %v", e)
		}
	}
	for k, n := range map[key]int{
		{"evt_ok_1", "processed"}: 2, {"evt_ok_1", "duplicate"}: 6, {"evt_ok_2", "payload_mismatch"}: 1,
		{"evt_fail_1", "released"}: 2, {"evt_held_1", "held"}: 1, {"evt_held_1", "in_flight"}: 1,
		{"", "invalid_signature"}: 45, {"evt_down_0", "store_error"}: 1, {"evt_pass_0", "unchecked"}: 1,
		{"", "too_large"}: 1, {"", "bad_request"}: 1,
	} {
		if count[k] != n {
			t.Errorf("access log: %d entries with event_id %q and dedup_outcome %q, want %d", count[k], k.id, k.outcome, n)
		}
	}
}

// spanStub is what OpenTelemetry's console exporter writes of a span.
type spanStub struct {
	Name       string
	Attributes []struct {
		Key   string
		Value struct{ Value any }
	}
	Events []struct{ Name string }
}

func (s spanStub) attr(k string) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return fmt.Sprint(a.Value.Value)
		}
	}
	return ""
}

// checkTraces: with Caddy's tracing on (docs/observability.md's recipe), each
// delivery's span carries the event ID, outcome, provider, store and
// endpoint, and a held or released event has its span event.
func (f *fleet) checkTraces(t *testing.T) {
	find := func(spans []spanStub, id, outcome, endpoint string) *spanStub {
		for i, s := range spans {
			if s.attr("messaging.message.id") == id && s.attr("sangho_dedup.outcome") == outcome && s.attr("sangho_dedup.endpoint") == endpoint {
				return &spans[i]
			}
		}
		return nil
	}
	var spans []spanStub
	waitFor(t, 15*time.Second, "the spans on Caddy's standard output", func() bool {
		b, _ := os.ReadFile(f.caddyOut)
		spans = spans[:0]
		dec := json.NewDecoder(bytes.NewReader(b))
		for {
			var s spanStub
			if dec.Decode(&s) != nil {
				break
			}
			spans = append(spans, s)
		}
		return find(spans, "evt_commit_1", "processed", "commit") != nil
	})
	for _, c := range []struct{ id, outcome, store, endpoint, event string }{
		{"evt_ok_1", "processed", "file", "payments_file", ""},
		{"evt_ok_1", "duplicate", "redis", "payments_redis", ""},
		{"evt_fail_1", "released", "file", "payments_file", "sangho_dedup.event_released"},
		{"evt_held_1", "held", "file", "payments_file", "sangho_dedup.event_held"},
		{"evt_held_1", "in_flight", "file", "payments_file", ""},
		{"evt_down_0", "store_error", "redis", "down", ""},
	} {
		s := find(spans, c.id, c.outcome, c.endpoint)
		if s == nil {
			t.Errorf("no span with messaging.message.id %s and sangho_dedup.outcome %s among %d", c.id, c.outcome, len(spans))
			continue
		}
		if s.attr("sangho_dedup.provider") != "sangho" || s.attr("sangho_dedup.store") != c.store || s.attr("sangho_dedup.endpoint") != c.endpoint {
			t.Errorf("span of %s %s: %+v", c.id, c.outcome, s.Attributes)
		}
		var events []string
		for _, e := range s.Events {
			events = append(events, e.Name)
		}
		if c.event != "" && (len(events) != 1 || events[0] != c.event) || c.event == "" && len(events) != 0 {
			t.Errorf("span of %s %s: events %v, want [%s]", c.id, c.outcome, events, c.event)
		}
	}
}

// traffic sends a mix of deliveries for d, for the panel pictures:
// new events and redeliveries on the file store and on Redis, bursts of
// forged signatures, a store outage, held events meeting redeliveries
// (409), slow claims, claims refused by PostgreSQL.
func (f *fleet) traffic(t *testing.T, d time.Duration) {
	begin := time.Now()
	var wg sync.WaitGroup
	for i := 0; time.Since(begin) < d; i++ {
		phase := time.Since(begin) / (d / 6) // six phases
		n := i
		wg.Go(func() {
			id := fmt.Sprintf("evt_traffic_%d", n)
			f.deliver(t, "payments_file", event(id), secret)
			f.deliver(t, "payments_redis", event(id), secret)
			if n%3 == 0 { // Sangho's redeliveries
				f.deliver(t, "payments_file", event(fmt.Sprintf("evt_traffic_%d", n-3)), secret)
				f.deliver(t, "payments_redis", event(fmt.Sprintf("evt_traffic_%d", n-3)), secret)
			}
			switch {
			case phase == 1 && n%2 == 0: // someone probing the endpoint
				for j := range 4 {
					f.deliver(t, "payments_file", event(fmt.Sprintf("evt_probe_%d_%d", n, j)), "whsec_guess")
				}
				f.deliver(t, "payments_redis", event("evt_probe"), "")
			case phase == 2: // a store outage
				f.deliver(t, "down", event(id), secret)
			case phase == 3 && n%8 == 0: // a backend timing out
				held := "evt_held_traffic_" + strconv.Itoa(n)
				wg.Go(func() { f.deliver(t, "payments_file", event(held), secret) })
				if f.waitArrived(t, held) {
					f.deliver(t, "payments_file", event(held), secret)
				}
			case phase == 4 && n%2 == 0:
				f.deliver(t, "slow", event(id), secret)
			case phase == 5 && n%4 == 0: // a PostgreSQL role without its privileges
				f.deliver(t, "pg_acl", event(id), secret)
			}
		})
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	time.Sleep(3 * time.Second) // scraped
}
