package sanghodedup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// Whole-server tests: a real Caddy (in this process) with sangho_dedup
// in front of reverse_proxy, and a backend that keeps a ledger of what it
// receives (internal/testkit/ledger). Everything listens on 127.0.0.1.

// caddyServer runs one Caddy config in this process.
type caddyServer struct {
	url  string
	port int
	// logFile, if set, receives Caddy's log (JSON) from the next load
	// on; else it is discarded.
	logFile string
}

// serverConfig is the Caddyfile of a test server: the site block
// body is given by the test, %PORT% is filled in.
func serverCaddyfile(port int, site string) string {
	return serverCaddyfileLogging(port, site, "")
}

// serverCaddyfileLogging is serverCaddyfile with Caddy's log in logFile
// (JSON), or discarded if it is "".
func serverCaddyfileLogging(port int, site, logFile string) string {
	output := "discard"
	if logFile != "" {
		output = "file " + logFile + "\n\t\tformat json"
	}
	return fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output %s
	}
}
http://127.0.0.1:%d {
	bind 127.0.0.1
%s
}
`, output, port, site)
}

// startCaddy loads a config; the test's cleanup stops Caddy.
func startCaddy(t testing.TB, site string) *caddyServer {
	t.Helper()
	ownDataDir(t)
	port := freePort(t)
	s := &caddyServer{url: "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook", port: port}
	s.load(t, site)
	t.Cleanup(func() { _ = caddy.Stop() })
	return s
}

// startCaddyLogging is startCaddy with Caddy's log, JSON, in s.logFile.
func startCaddyLogging(t *testing.T, site string) *caddyServer {
	t.Helper()
	ownDataDir(t)
	port := freePort(t)
	s := &caddyServer{url: "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook", port: port, logFile: filepath.Join(t.TempDir(), "caddy.log")}
	s.load(t, site)
	t.Cleanup(func() { _ = caddy.Stop() })
	return s
}

// warnedAtLoad loads site on a Caddy that logs to a file, stops it, and
// returns the warnings msg in its log, and the whole log.
func warnedAtLoad(t *testing.T, site, msg string) (warned []map[string]any, log string) {
	t.Helper()
	s := startCaddyLogging(t, site)
	_ = caddy.Stop()
	entries, text := logEntries(t, s.logFile)
	for _, e := range entries {
		if e["msg"] == msg && e["level"] == "warn" {
			warned = append(warned, e)
		}
	}
	return warned, text
}

var dataDirs sync.Map // testing.TB → true

// ownDataDir gives the test a Caddy data directory of its own (once per
// test, so that a test that restarts Caddy finds its file again): the
// default store's file would otherwise be one for the whole test binary,
// and go test -count=N would find the events of the run before.
func ownDataDir(t testing.TB) {
	if _, seen := dataDirs.LoadOrStore(t, true); seen {
		return
	}
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Cleanup(func() { dataDirs.Delete(t) })
}

// caddyLoad loads a whole JSON config; the test's cleanup must stop Caddy.
func caddyLoad(cfg string) error { return caddy.Load([]byte(cfg), true) }

// load (re)loads the server with a new site body: a config reload.
func (s *caddyServer) load(t testing.TB, site string) {
	t.Helper()
	cfg, _ := adaptCaddyfile(t, serverCaddyfileLogging(s.port, site, s.logFile))
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
}

// The test client opens a connection per request: a config reload
// closes idle keep-alive connections, which would fail the next request
// for a reason that has nothing to do with the plugin.
var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

type answer struct {
	status int
	dedup  string
	body   string
	header http.Header
}

// send signs body now and posts it, as Sangho does.
func send(t testing.TB, url, body, id string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if id != "" {
		req.Header.Set("Sangho-Event-ID", id)
	}
	req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), secret1))
	return do(t, req)
}

// sendWith signs body with secret and posts it.
func sendWith(t testing.TB, url, body, secret string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), secret))
	return do(t, req)
}

// do sends req; like Sangho it tries again when the connection fails
// before any answer (a listener handed over during a config reload can
// reset a connection), a bounded number of times.
func do(t testing.TB, req *http.Request) answer {
	t.Helper()
	var body []byte
	if req.Body != nil && req.ContentLength >= 0 {
		body, _ = io.ReadAll(req.Body)
	}
	var resp *http.Response
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if body != nil {
			req.Body = io.NopCloser(bytes.NewReader(body))
		}
		if resp, err = client.Do(req); err == nil {
			break
		}
		// Retried: a connection Caddy refused while it loads its config.
		// Not retried: an answer that did not come in time (the request
		// reached the handler; sent again, it would be another delivery,
		// and a slow one repeated 20 times looks like a hang).
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Sangho-Dedup"), string(b), resp.Header}
}

func dedupSite(backend, storeAndOptions string) string {
	return fmt.Sprintf(`	sangho_dedup {
		secret %s
		%s
	}
	reverse_proxy %s`, secret1, storeAndOptions, backend)
}

func redisStoreLine(addr string) string {
	return "store redis {\n\t\t\taddress " + addr + "\n\t\t\tdial_timeout 200ms\n\t\t\tread_timeout 500ms\n\t\t}"
}

func TestServerStatusTable(t *testing.T) {
	l := ledger.New(t)
	l.Behave(func(id string, n int) ledger.Action {
		if id == "evt_slow" {
			return ledger.Action{Delay: 400 * time.Millisecond}
		}
		if id == "evt_created" {
			return ledger.Action{Status: 201}
		}
		return ledger.Action{}
	})
	s := startCaddy(t, dedupSite(l.Addr, "max_body_size 2KiB\n\t\tretry_after 7s"))

	post := func(body string, mutate func(*http.Request)) answer {
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), secret1))
		if mutate != nil {
			mutate(req)
		}
		return do(t, req)
	}
	check := func(name string, a answer, status int) {
		t.Helper()
		if a.status != status {
			t.Errorf("%s: status %d, want %d (body %q)", name, a.status, status, a.body)
		}
	}
	big := `{"id":"evt_big","pad":"` + strings.Repeat("x", 3000) + `"}`

	a := post(eventBody("evt_get"), func(r *http.Request) { r.Method = http.MethodGet })
	check("GET", a, 405)
	if a.header.Get("Allow") != "POST" {
		t.Errorf("405 without Allow: POST: %v", a.header)
	}
	check("body over max_body_size", post(big, nil), 413)
	check("chunked body over max_body_size", post(big, func(r *http.Request) {
		r.Body = io.NopCloser(io.MultiReader(strings.NewReader(big))) // unknown length: sent chunked
		r.ContentLength = -1
	}), 413)
	check("no signature", post(eventBody("evt_nosig"), func(r *http.Request) { r.Header.Del("Sangho-Signature") }), 401)
	check("bad signature", post(eventBody("evt_badsig"), func(r *http.Request) {
		r.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(eventBody("evt_badsig")), secret2))
	}), 401)
	check("old signature", post(eventBody("evt_old"), func(r *http.Request) {
		r.Header.Set("Sangho-Signature", sangho.Sign(time.Now().Add(-6*time.Minute), []byte(eventBody("evt_old")), secret1))
	}), 401)
	check("future signature", post(eventBody("evt_future"), func(r *http.Request) {
		r.Header.Set("Sangho-Signature", sangho.Sign(time.Now().Add(6*time.Minute), []byte(eventBody("evt_future")), secret1))
	}), 401)
	check("no event ID", post(`{"type":"x"}`, nil), 400)
	check("invalid event ID", post(`{"id":"evt 1"}`, nil), 400)
	check("IDs differ", post(eventBody("evt_body"), func(r *http.Request) { r.Header.Set("Sangho-Event-ID", "evt_header") }), 400)

	a = send(t, s.url, eventBody("evt_created"), "evt_created")
	if a.status != 201 || a.body != `{"app":"evt_created"}` || a.header.Get("X-Backend") != "ledger" || a.dedup != "" {
		t.Errorf("new event: the backend's answer was changed: %d %q %v", a.status, a.body, a.header)
	}
	a = send(t, s.url, eventBody("evt_created"), "evt_created")
	if a.status != 200 || a.body != `{"received":true}` || a.dedup != "duplicate" || a.header.Get("Content-Type") != "application/json" {
		t.Errorf("duplicate: %d %q %v", a.status, a.body, a.header)
	}

	// in flight: one slow delivery, another meanwhile
	done := make(chan answer)
	go func() { done <- send(t, s.url, eventBody("evt_slow"), "evt_slow") }()
	deadline := time.Now().Add(5 * time.Second)
	for n, _ := l.Counts("evt_slow"); n == 0; n, _ = l.Counts("evt_slow") {
		if time.Now().After(deadline) {
			t.Fatal("the slow event never reached the backend")
		}
		time.Sleep(5 * time.Millisecond)
	}
	a = send(t, s.url, eventBody("evt_slow"), "evt_slow")
	if a.status != 409 || a.header.Get("Retry-After") != "7" {
		t.Errorf("in flight: %d Retry-After %q", a.status, a.header.Get("Retry-After"))
	}
	if first := <-done; first.status != 200 {
		t.Errorf("slow event: %d", first.status)
	}

	for _, id := range []string{"evt_get", "evt_big", "evt_nosig", "evt_badsig", "evt_old", "evt_future", "evt_body", "evt_header"} {
		if n, _ := l.Counts(id); n != 0 {
			t.Errorf("%s reached the backend %d times", id, n)
		}
	}
	for id, want := range map[string]int{"evt_created": 1, "evt_slow": 1} {
		if n, _ := l.Counts(id); n != want {
			t.Errorf("%s reached the backend %d times, want %d", id, n, want)
		}
	}
}

func TestServerBodyReachesBackendByteForByte(t *testing.T) {
	l := ledger.New(t)
	l.RecordBodies()
	s := startCaddy(t, dedupSite(l.Addr, ""))
	if a := send(t, s.url, bodyB, "evt_unicode_body"); a.status != 200 {
		t.Fatalf("%d", a.status)
	}
	got := l.Body("evt_unicode_body")
	if !bytes.Equal(got, []byte(bodyB)) {
		t.Fatalf("backend got %q, want %q", got, bodyB)
	}
}

// forStores runs a test on the default store (file, in the test's data
// directory), on the memory store and on Redis.
func forStores(t *testing.T, test func(t *testing.T, store string)) {
	t.Run("default", func(t *testing.T) {
		test(t, "key_prefix "+testPrefix(t)+":")
	})
	t.Run("memory", func(t *testing.T) {
		test(t, "store memory\n\t\tkey_prefix "+testPrefix(t)+":")
	})
	t.Run("redis", func(t *testing.T) { test(t, redisStoreLine(startRedis(t).Addr)) })
}

var testRuns atomic.Int64

// testPrefix is a key prefix of this test's own: the default store's
// file is one for the whole test binary, and go test -count=N runs a
// test N times in it.
func testPrefix(t testing.TB) string {
	// A key_prefix takes no white space or braces (a subtest's name may
	// hold a store's JSON).
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == '{' || r == '}' || unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, t.Name())
	return name + "_" + strconv.FormatInt(testRuns.Add(1), 10)
}

func TestServerSequentialDeliveriesProcessedOnce(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		s := startCaddy(t, dedupSite(l.Addr, store))
		for i := range 10 {
			a := send(t, s.url, bodyA, "evt_1QZtest000000000001")
			if a.status != 200 {
				t.Fatalf("delivery %d: %d", i+1, a.status)
			}
			if i > 0 && a.dedup != "duplicate" {
				t.Fatalf("delivery %d not answered as a duplicate", i+1)
			}
		}
		if rec, ok := l.Counts("evt_1QZtest000000000001"); rec != 1 || ok != 1 {
			t.Fatalf("backend received %d, processed %d; want 1 and 1", rec, ok)
		}
	})
}

func TestServerConcurrentDeliveriesProcessedOnce(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 50 * time.Millisecond} })
		s := startCaddy(t, dedupSite(l.Addr, store))
		const n = 50
		var wg sync.WaitGroup
		var acked, conflicts, other atomic.Int32
		start := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Like Sangho: retry until 2xx, bounded.
				for attempt := 0; attempt < 100; attempt++ {
					a := send(t, s.url, bodyA, "")
					switch a.status {
					case 200:
						acked.Add(1)
						return
					case 409:
						conflicts.Add(1)
						time.Sleep(20 * time.Millisecond)
					default:
						other.Add(1)
						return
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		rec, ok := l.Counts("")
		t.Logf("%d deliveries acknowledged, %d answered 409 and retried, backend received %d", acked.Load(), conflicts.Load(), rec)
		if acked.Load() != n || other.Load() != 0 {
			t.Fatalf("acknowledged %d of %d, %d unexpected answers", acked.Load(), n, other.Load())
		}
		if rec != 1 || ok != 1 {
			t.Fatalf("backend received %d, processed %d; want exactly once", rec, ok)
		}
	})
}

func TestServerFailedAttemptIsRetried(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		l.Behave(func(id string, n int) ledger.Action {
			if n == 1 {
				return ledger.Action{Status: 500}
			}
			return ledger.Action{}
		})
		s := startCaddy(t, dedupSite(l.Addr, store))
		if a := send(t, s.url, bodyA, ""); a.status != 500 {
			t.Fatalf("first attempt: %d, want the backend's 500", a.status)
		}
		if a := send(t, s.url, bodyA, ""); a.status != 200 || a.dedup != "" {
			t.Fatalf("retry: %d %q, want processed", a.status, a.dedup)
		}
		if a := send(t, s.url, bodyA, ""); a.dedup != "duplicate" {
			t.Fatalf("third: %d %q, want duplicate", a.status, a.dedup)
		}
		if rec, ok := l.Counts(""); rec != 2 || ok != 1 {
			t.Fatalf("backend received %d, processed %d; want 2 and 1", rec, ok)
		}
	})
}

func TestServerBackendDownIsReleased(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		// A port where nothing listens: reverse_proxy answers 502.
		dead := "127.0.0.1:" + strconv.Itoa(freePort(t))
		s := startCaddy(t, dedupSite(dead, store))
		if a := send(t, s.url, bodyA, ""); a.status != 502 {
			t.Fatalf("backend down: %d, want 502", a.status)
		}
		l := ledger.New(t)
		s.load(t, dedupSite(l.Addr, store))
		// Sangho retries a 502 as any failure; so does the test, a few
		// times: a connection the old config's server accepted just
		// before the reload can still be answered by it (seen once in a
		// full run), and that is one more released attempt.
		a := send(t, s.url, bodyA, "")
		for i := 0; i < 3 && a.status == http.StatusBadGateway; i++ {
			time.Sleep(100 * time.Millisecond)
			a = send(t, s.url, bodyA, "")
		}
		if a.status != 200 || a.dedup != "" {
			t.Fatalf("after the backend came back: %d %q", a.status, a.dedup)
		}
		if rec, ok := l.Counts(""); rec != 1 || ok != 1 {
			t.Fatalf("backend received %d, processed %d", rec, ok)
		}
	})
}

func TestServerRedisOutage(t *testing.T) {
	r := startRedis(t)
	l := ledger.New(t)
	s := startCaddy(t, dedupSite(l.Addr, redisStoreLine(r.Addr)))
	if a := send(t, s.url, eventBody("evt_before"), ""); a.status != 200 {
		t.Fatalf("before the outage: %d", a.status)
	}
	r.Kill()
	for i := range 3 {
		a := send(t, s.url, eventBody("evt_during"), "")
		if a.status != 503 || a.header.Get("Retry-After") != "10" {
			t.Fatalf("Redis down, attempt %d: %d Retry-After %q; want 503 and 10", i, a.status, a.header.Get("Retry-After"))
		}
	}
	if n, _ := l.Counts(""); n != 1 {
		t.Fatalf("something reached the backend while Redis was down (%d deliveries in all)", n)
	}
	r.Restart(t) // same port, empty data: no restart of Caddy
	if a := send(t, s.url, eventBody("evt_during"), ""); a.status != 200 || a.dedup != "" {
		t.Fatalf("after Redis came back: %d %q", a.status, a.dedup)
	}
	if a := send(t, s.url, eventBody("evt_during"), ""); a.dedup != "duplicate" {
		t.Fatalf("dedup after Redis came back: %d %q", a.status, a.dedup)
	}
}

// TestServerStartsWithRedisDown: Provision does not need Redis.
func TestServerStartsWithRedisDown(t *testing.T) {
	r := startRedis(t)
	r.Kill()
	l := ledger.New(t)
	s := startCaddy(t, dedupSite(l.Addr, redisStoreLine(r.Addr)))
	if a := send(t, s.url, bodyA, ""); a.status != 503 {
		t.Fatalf("Redis down at start: %d, want 503", a.status)
	}
	r.Restart(t)
	if a := send(t, s.url, bodyA, ""); a.status != 200 {
		t.Fatalf("after Redis started: %d", a.status)
	}
}

func TestServerStoreErrorPass(t *testing.T) {
	r := startRedis(t)
	r.Kill()
	l := ledger.New(t)
	s := startCaddy(t, dedupSite(l.Addr, redisStoreLine(r.Addr)+"\n\t\ton_store_error pass"))
	if a := send(t, s.url, bodyA, "evt_1QZtest000000000001"); a.status != 200 || a.body != `{"app":"evt_1QZtest000000000001"}` {
		t.Fatalf("pass: %d %q, want the backend's answer", a.status, a.body)
	}
	if n, _ := l.Counts("evt_1QZtest000000000001"); n != 1 {
		t.Fatalf("backend received %d, want 1 (unchecked)", n)
	}
}

func TestServerReloadKeepsProcessedIDs(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		s := startCaddy(t, dedupSite(l.Addr, store))
		if a := send(t, s.url, bodyA, ""); a.status != 200 {
			t.Fatalf("%d", a.status)
		}
		// A real change, so that Caddy does reload: another tolerance.
		s.load(t, dedupSite(l.Addr, store+"\n\t\ttolerance 4m"))
		if a := send(t, s.url, bodyA, ""); a.dedup != "duplicate" {
			t.Fatalf("after a reload: %d %q, want duplicate", a.status, a.dedup)
		}
		if rec, _ := l.Counts(""); rec != 1 {
			t.Fatalf("backend received %d", rec)
		}
	})
}

func TestServerHandleErrorsShapesRejections(t *testing.T) {
	l := ledger.New(t)
	s := startCaddy(t, dedupSite(l.Addr, "")+`
	handle_errors {
		header Content-Type application/json
		respond `+"`"+`{"error":{http.error.status_code},"outcome":"{http.sangho_dedup.outcome}"}`+"`"+` {http.error.status_code}
	}`)
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(bodyA))
	a := do(t, req)
	if a.status != 401 || a.body != `{"error":401,"outcome":"invalid_signature"}` {
		t.Fatalf("handle_errors: %d %q", a.status, a.body)
	}
}

// TestServerPlaceholdersInLogsAndHeaders: the placeholders reach a
// deferred header (docs/observability.md), for a delivery passed to the
// backend too: its outcome is known from the backend's status line,
// before that line goes out through the header handler, and
// prior_attempt is empty, not the placeholder's own text, on an
// unmarked delivery. (Found by review: both were the literal
// placeholder for every delivery that reached the backend.)
func TestServerPlaceholdersInLogsAndHeaders(t *testing.T) {
	l := ledger.New(t)
	l.Behave(func(id string, n int) ledger.Action {
		if id == "evt_fails" {
			return ledger.Action{Status: 500}
		}
		return ledger.Action{}
	})
	s := startCaddy(t, `	header >X-Event {http.sangho_dedup.event_id}
	header >X-Type {http.sangho_dedup.event_type}
	header >X-Outcome {http.sangho_dedup.outcome}
	header >X-Prior "p={http.sangho_dedup.prior_attempt}"
`+dedupSite(l.Addr, ""))
	a := send(t, s.url, bodyA, "")
	if a.header.Get("X-Event") != "evt_1QZtest000000000001" || a.header.Get("X-Type") != "payment_intent.succeeded" ||
		a.header.Get("X-Outcome") != "processed" || a.header.Get("X-Prior") != "p=" {
		t.Fatalf("placeholders of a processed delivery: %v; want X-Outcome processed, X-Prior p=", a.header)
	}
	a = send(t, s.url, bodyA, "")
	if a.header.Get("X-Outcome") != "duplicate" {
		t.Fatalf("outcome placeholder: %v", a.header)
	}
	a = send(t, s.url, `{"id":"evt_fails","type":"invoice.paid"}`, "evt_fails")
	if a.status != 500 || a.header.Get("X-Outcome") != "released" || a.header.Get("X-Prior") != "p=" {
		t.Fatalf("placeholders of a delivery the backend failed: %d %v; want 500, X-Outcome released, X-Prior p=", a.status, a.header)
	}
}

// TestServerKeyPrefixSeparatesRoutes: two endpoints (tenants) share one
// Redis; the same event ID is independent on each, and deduplicated
// within each.
func TestServerKeyPrefixSeparatesRoutes(t *testing.T) {
	r := startRedis(t)
	la, lb := ledger.New(t), ledger.New(t)
	store := redisStoreLine(r.Addr)
	s := startCaddy(t, fmt.Sprintf(`	handle /a {
		sangho_dedup {
			secret %s
			key_prefix tenant_a:
			%s
		}
		reverse_proxy %s
	}
	handle /b {
		sangho_dedup {
			secret %s
			key_prefix tenant_b:
			%s
		}
		reverse_proxy %s
	}`, secret1, store, la.Addr, secret1, store, lb.Addr))
	base := strings.TrimSuffix(s.url, "/webhook")
	for range 3 {
		send(t, base+"/a", bodyA, "")
		send(t, base+"/b", bodyA, "")
	}
	if ra, _ := la.Counts(""); ra != 1 {
		t.Errorf("tenant a's backend got the event %d times, want 1", ra)
	}
	if rb, _ := lb.Counts(""); rb != 1 {
		t.Errorf("tenant b's backend got the event %d times, want 1", rb)
	}
	keys, _ := r.Client(t).Keys(context.Background(), "*").Result()
	if len(keys) != 2 || !slices.Contains(keys, "tenant_a:evt_1QZtest000000000001") || !slices.Contains(keys, "tenant_b:evt_1QZtest000000000001") {
		t.Errorf("keys in Redis: %v", keys)
	}
}

// twoEndpoints is one Caddy with two webhook endpoints, /a and /b, each
// with its own secret and backend; options go into both.
func twoEndpoints(backendA, backendB, optionsA, optionsB string) string {
	return fmt.Sprintf(`	handle /a {
		sangho_dedup {
			secret %s
			%s
		}
		reverse_proxy %s
	}
	handle /b {
		sangho_dedup {
			secret %s
			%s
		}
		reverse_proxy %s
	}`, secret1, optionsA, backendA, secret2, optionsB, backendB)
}

// Payment providers send one event to every endpoint that subscribes.
// Two endpoints with different secrets that would share one store and
// key prefix would swallow each other's events: that config is refused,
// on every store, naming the fix; the same endpoint on two routes (same
// secrets) is fine.
func TestServerEndpointsSharingDataNeedDistinctPrefixes(t *testing.T) {
	r := startRedis(t)
	stores := map[string]string{
		"default": "",
		"file":    "store file " + filepath.Join(t.TempDir(), "shared.db"),
		"memory":  "store memory",
		"redis":   redisStoreLine(r.Addr),
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			cfg, _ := adaptCaddyfile(t, serverCaddyfile(freePort(t), twoEndpoints("127.0.0.1:1", "127.0.0.1:1", store, store)))
			err := caddyLoad(cfg)
			defer caddy.Stop()
			if err == nil {
				t.Fatal("a config with two endpoints on one store and prefix, with different secrets, loaded")
			}
			for _, want := range []string{"key_prefix", "different secrets"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q: %v", want, err)
				}
			}
			if strings.Contains(err.Error(), secret1) || strings.Contains(err.Error(), secret2) {
				t.Fatalf("error holds a secret: %v", err)
			}
		})
	}
	t.Run("same secrets on two routes", func(t *testing.T) {
		site := strings.Replace(twoEndpoints("127.0.0.1:1", "127.0.0.1:1", "", ""), "secret "+secret2, "secret "+secret1, 1)
		startCaddy(t, site) // fails the test if the config is refused
	})
}

// The case a new user meets: one event delivered to two endpoints of one
// Caddy, each with its own key_prefix, reaches each backend once.
func TestServerOneEventTwoEndpoints(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		la, lb := ledger.New(t), ledger.New(t)
		prefix := testPrefix(t)
		if strings.Contains(store, "key_prefix") {
			store = store[:strings.Index(store, "key_prefix")]
		}
		s := startCaddy(t, twoEndpoints(la.Addr, lb.Addr,
			store+"\n\t\t\tkey_prefix "+prefix+"_a:", store+"\n\t\t\tkey_prefix "+prefix+"_b:"))
		base := strings.TrimSuffix(s.url, "/webhook")
		for range 3 {
			if a := sendWith(t, base+"/a", bodyA, secret1); a.status != 200 {
				t.Fatalf("endpoint a: %d %s", a.status, a.body)
			}
			if a := sendWith(t, base+"/b", bodyA, secret2); a.status != 200 {
				t.Fatalf("endpoint b: %d %s", a.status, a.body)
			}
		}
		if n, _ := la.Counts(""); n != 1 {
			t.Errorf("endpoint a's backend got the event %d times, want 1", n)
		}
		if n, _ := lb.Counts(""); n != 1 {
			t.Errorf("endpoint b's backend got the event %d times, want 1", n)
		}
	})
}
