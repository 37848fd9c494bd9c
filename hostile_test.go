package sanghodedup

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// TestHostileRequests sends what an attacker or a broken client would,
// through a real Caddy with the Redis store. Each request gets its
// documented answer, none reaches the backend unless it is a valid signed
// event, and none leaves a key in Redis.
func TestHostileRequests(t *testing.T) {
	r := startRedis(t)
	rc := r.Client(t)
	l := ledger.New(t)
	s := startCaddy(t, `	sangho_dedup {
		secret `+secret1+`
		max_body_size 4KiB
		`+redisStoreLine(r.Addr)+`
	}
	reverse_proxy `+l.Addr)
	// (Caddy's server timeouts bound slow bodies; see TestSlowBody.)
	now := time.Now()
	sig := func(body string) string { return sangho.Sign(now, []byte(body), secret1) }
	id255, id256, id10k := strings.Repeat("a", 255), strings.Repeat("b", 256), strings.Repeat("c", 10000)
	manyV1 := "t=" + strconv.FormatInt(now.Unix(), 10) + strings.Repeat(",v1="+strings.Repeat("0", 64), 200)
	hugeHeader := "t=" + strconv.FormatInt(now.Unix(), 10) + strings.Repeat(",v1="+strings.Repeat("0", 64), 3000)
	cases := []struct {
		name   string
		body   string
		header map[string][]string
		status int
		passes bool
	}{
		{"invalid JSON object", `{"id":"evt_h1",`, nil, 400, false},
		{"duplicate id keys", `{"id":"evt_h2a","id":"evt_h2b"}`, nil, 400, false},
		{"id and ID keys (encoding/json would read ID)", `{"id":"evt_h2c","ID":"evt_h2d"}`, nil, 400, false},
		{"invalid literal beside a valid id", `{"a": nul, "id":"evt_h2e"}`, nil, 400, false},
		{"byte order mark before the object", "\xef\xbb\xbf" + `{"id":"evt_h2f"}`, map[string][]string{"Sangho-Event-Id": {"evt_h2g"}}, 400, false},
		{"id empty", `{"id":""}`, nil, 400, false},
		{"id 255 bytes", `{"id":"` + id255 + `"}`, nil, 200, true},
		{"id 256 bytes", `{"id":"` + id256 + `"}`, nil, 400, false},
		{"id 10000 bytes in the header", `{}`, map[string][]string{"Sangho-Event-Id": {id10k}}, 400, false},
		{"id not a string", `{"id":42}`, nil, 400, false},
		{"non-UTF-8 body, valid id", "{\"id\":\"evt_h3\",\"x\":\"\xff\xfe\"}", nil, 200, true},
		{"header and body ids differ", `{"id":"evt_h4"}`, map[string][]string{"Sangho-Event-Id": {"evt_h5"}}, 400, false},
		{"two event ID headers", `{}`, map[string][]string{"Sangho-Event-Id": {"evt_h6", "evt_h7"}}, 400, false},
		{"two signature headers", `{"id":"evt_h8"}`, map[string][]string{"Sangho-Signature": {sig(`{"id":"evt_h8"}`), sig(`{"id":"evt_h8"}`)}}, 401, false},
		{"huge t", `{"id":"evt_h9"}`, map[string][]string{"Sangho-Signature": {"t=99999999999999,v1=" + strings.Repeat("0", 64)}}, 401, false},
		{"t beyond int64", `{"id":"evt_h10"}`, map[string][]string{"Sangho-Signature": {"t=99999999999999999999999,v1=" + strings.Repeat("0", 64)}}, 401, false},
		{"negative t", `{"id":"evt_h11"}`, map[string][]string{"Sangho-Signature": {"t=-5,v1=" + strings.Repeat("0", 64)}}, 401, false},
		{"non-numeric t", `{"id":"evt_h12"}`, map[string][]string{"Sangho-Signature": {"t=now,v1=" + strings.Repeat("0", 64)}}, 401, false},
		{"200 wrong v1 (14 KB)", `{"id":"evt_h13"}`, map[string][]string{"Sangho-Signature": {manyV1}}, 401, false},
		{"3000 v1 (200 KB): Caddy's header limit answers", `{"id":"evt_h16"}`, map[string][]string{"Sangho-Signature": {hugeHeader}}, 431, false},
		{"200 wrong v1 and a right one", `{"id":"evt_h14"}`, map[string][]string{"Sangho-Signature": {manyV1 + "," + strings.SplitN(sig(`{"id":"evt_h14"}`), ",", 2)[1]}}, 200, true},
		{"forger: unsigned, with a real future event ID", `{"id":"evt_future"}`, map[string][]string{"Sangho-Signature": nil}, 401, false},
		{"forger: signed with a guessed secret", `{"id":"evt_future"}`, map[string][]string{"Sangho-Signature": {sangho.Sign(now, []byte(`{"id":"evt_future"}`), "whsec_guess")}}, 401, false},
		{"body over max_body_size", `{"id":"evt_h15","pad":"` + strings.Repeat("x", 5000) + `"}`, nil, 413, false},
	}
	passed := 0
	for _, c := range cases {
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(c.body))
		req.Header.Set("Sangho-Signature", sig(c.body))
		for k, v := range c.header {
			if v == nil {
				req.Header.Del(k)
			} else {
				req.Header[k] = v
			}
		}
		a := do(t, req)
		if a.status != c.status {
			t.Errorf("%s: %d, want %d", c.name, a.status, c.status)
		}
		if c.passes {
			passed++
		}
	}
	reached, _ := l.Totals()
	if reached != passed {
		t.Errorf("%d requests reached the backend, want %d (the valid ones)", reached, passed)
	}
	if n := rc.DBSize(context.Background()).Val(); n != int64(passed) {
		keys, _ := rc.Keys(context.Background(), "*").Result()
		t.Errorf("%d keys in Redis, want %d (one per processed event): %v", n, passed, keys)
	}
	// The forger burnt nothing: the real event is processed.
	if a := send(t, s.url, `{"id":"evt_future"}`, ""); a.status != 200 || a.dedup != "" {
		t.Errorf("the real evt_future after the forgeries: %d %q, want processed", a.status, a.dedup)
	}
}

// TestTruncatedAndSlowBodies: a body cut short (the client announces
// 500 bytes, sends 100 and goes away) and a slow-loris body (one byte
// every 100 ms, past Caddy's read_body timeout) reach nothing and leave
// no key behind.
func TestTruncatedAndSlowBodies(t *testing.T) {
	r := startRedis(t)
	rc := r.Client(t)
	l := ledger.New(t)
	port := freePort(t)
	cfg, _ := adaptCaddyfile(t, fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
	servers {
		timeouts {
			read_body 500ms
		}
	}
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sangho_dedup {
		secret %s
		%s
	}
	reverse_proxy %s
}`, port, secret1, redisStoreLine(r.Addr), l.Addr))
	if err := caddyLoad(cfg); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	body := `{"id":"evt_slow_body","pad":"` + strings.Repeat("x", 400) + `"}`
	head := fmt.Sprintf("POST /webhook HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nSangho-Signature: %s\r\nContent-Length: %d\r\n\r\n",
		addr, sangho.Sign(time.Now(), []byte(body), secret1), len(body))

	// truncated: 100 bytes, then the client closes its side
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, head, body[:100])
	c.(*net.TCPConn).CloseWrite()
	_, _ = bufio.NewReader(c).ReadString('\n')
	c.Close()

	// slow loris: a byte every 100 ms; read_body 500ms cuts it off
	c, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, head)
	status := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(c).ReadString('\n')
		status <- line
	}()
	for i := 0; i < 30; i++ {
		if _, err := c.Write([]byte{body[i]}); err != nil {
			break
		}
		select {
		case line := <-status:
			status <- line
			i = 30
		case <-time.After(100 * time.Millisecond):
		}
	}
	var line string
	select {
	case line = <-status:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow body was not cut off within 5s")
	}
	c.Close()
	if line != "" && !strings.Contains(line, " 400 ") && !strings.Contains(line, " 408 ") {
		t.Errorf("slow body answered %q, want 400 (or the connection closed)", line)
	}
	time.Sleep(100 * time.Millisecond)
	if n, _ := l.Counts("evt_slow_body"); n != 0 {
		t.Error("a truncated or slow body reached the backend")
	}
	if n := rc.DBSize(context.Background()).Val(); n != 0 {
		t.Errorf("%d keys left in Redis", n)
	}
	// and the whole event, sent properly, is processed
	if a := send(t, "http://"+addr+"/webhook", body, ""); a.status != 200 || a.dedup != "" {
		t.Errorf("the complete event: %d %q", a.status, a.dedup)
	}
}

// TestHeaderOnlyConnectionsCostNoBody: 200 connections that send only
// headers announcing a 1 MiB body (no body, no signature) and wait must
// not make Caddy allocate their bodies: the body buffer grows with the
// bytes that arrive, not with Content-Length. Measured in this process
// (Caddy runs in it): live heap after a GC, before and while the 200
// connections wait inside sangho_dedup's body read.
func TestHeaderOnlyConnectionsCostNoBody(t *testing.T) {
	const conns = 200
	l := ledger.New(t)
	s := startCaddy(t, "\troute {\n\t\ttest_body_probe\n"+dedupSite(l.Addr, "")+"\n\t}")
	addr := "127.0.0.1:" + strconv.Itoa(s.port)
	// One real event first, so that what a request needs anyway (pools,
	// lazily built state) is in the baseline.
	if a := send(t, s.url, bodyA, ""); a.status != 200 {
		t.Fatalf("warm-up event: %d", a.status)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	bodyReadsStarted.Store(0)
	idle := heap()
	head := fmt.Sprintf("POST /webhook HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n", addr)
	for i := 0; i < conns; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for bodyReadsStarted.Load() < conns {
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s only %d of %d requests reached the body read", bodyReadsStarted.Load(), conns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	held := heap()
	grew := int64(held) - int64(idle)
	t.Logf("live heap: %.1f MiB idle, %.1f MiB with %d header-only connections waiting (%+.1f MiB)",
		float64(idle)/(1<<20), float64(held)/(1<<20), conns, float64(grew)/(1<<20))
	if grew > 20<<20 {
		t.Fatalf("%d header-only connections grew the live heap by %.1f MiB, want under 20 MiB", conns, float64(grew)/(1<<20))
	}
}

// TestServerErrorRouteGetsNoRecycledBody: a backend reads the first
// bytes of a large event and resets the connection, so reverse_proxy
// has read part of the body, closes it and fails; the body buffer goes
// back to the pool. A handle_errors route that proxies the request
// again must not send the rest of that buffer (which may by then hold
// another request): its read fails, and the fallback receives no body
// byte.
func TestServerErrorRouteGetsNoRecycledBody(t *testing.T) {
	// The failing backend: reads the headers and 1 KiB, then resets.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(time.Minute)) // a connection that sends nothing does not hold the loop
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			_, _ = io.ReadFull(br, make([]byte, 1024))
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
	}()
	fallback := ledger.New(t)
	fallback.RecordBodies()
	s := startCaddy(t, `	sangho_dedup {
		secret `+secret1+`
		max_body_size 64MiB
	}
	reverse_proxy `+ln.Addr().String()+`
	handle_errors {
		reverse_proxy `+fallback.Addr+`
	}`)
	// Larger than what the kernel can take from reverse_proxy before the
	// reset, so that the reset comes while reverse_proxy is still sending:
	// that is the failing backend's receive buffer (it reads 1 KiB, so its
	// window stays near Linux's initial 128 KiB) plus Caddy's send buffer
	// (at most 4 MiB, Linux's default tcp_wmem maximum). Measured: 64 KiB
	// to 3.6 MiB (a starved backend) were sent before the reset. Not larger: under -race every
	// MiB costs Caddy about half a second of a loaded machine's CPU
	// (32 MiB took over 15 s).
	body := `{"id":"evt_recycled","pad":"` + strings.Repeat("x", 8<<20) + `"}`
	// One attempt with a deadline of its own: send's client gives up
	// after 10 s and sends the event again, which would only repeat the
	// work.
	req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Sangho-Event-ID", "evt_recycled")
	req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), secret1))
	const deadline = 2 * time.Minute
	resp, err := (&http.Client{Timeout: deadline, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("no answer within %v: %v", deadline, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// The error route runs without the body (see
	// TestServerErrorRoutesNeverGetTheEvent): the fallback answers an
	// empty request.
	// The fallback counts a request once it has read what body it got;
	// on a starved machine that can come after the answer, and after
	// Down has given up: wait for it, or a fallback never reached would
	// pass the test without its having proved anything.
	for end := time.Now().Add(deadline); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := fallback.Counts("evt_recycled"); n > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the error route did not reach the fallback within %v", deadline)
		}
	}
	fallback.Down()
	got := fallback.Body("evt_recycled")
	reached, _ := fallback.Counts("evt_recycled")
	t.Logf("answer %d; the fallback was reached %d times with %d body bytes", resp.StatusCode, reached, len(got))
	if len(got) != 0 {
		t.Fatalf("the error route sent %d bytes read from the recycled body buffer", len(got))
	}
}

// TestServerHeaderIDReplay: the reproduction through a real
// Caddy: one captured delivery of a body without "id", replayed with new
// Sangho-Event-ID values within the tolerance. By default every one is
// refused (400); with require_body_id off only the first is processed and
// the replays are answered as its duplicates (200, nothing sent on), on
// each store (the remembered signature lives in the store, so it holds
// across instances sharing it).
func TestServerHeaderIDReplay(t *testing.T) {
	body := `{"object":"event","type":"invoice.paid","data":{"amount":10}}`
	post := func(url, sig, id string) int {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Sangho-Signature", sig)
		req.Header.Set("Sangho-Event-ID", id)
		return do(t, req).status
	}
	t.Run("default", func(t *testing.T) {
		l := ledger.New(t)
		s := startCaddy(t, dedupSite(l.Addr, ""))
		sig := sangho.Sign(time.Now(), []byte(body), secret1)
		for _, id := range []string{"evt_r1", "evt_r2", "evt_r3"} {
			if st := post(s.url, sig, id); st != 400 {
				t.Errorf("%s: %d, want 400", id, st)
			}
		}
		if n, _ := l.Counts(""); n != 0 {
			t.Errorf("the backend was reached")
		}
	})
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		s := startCaddy(t, dedupSite(l.Addr, store+"\n\t\trequire_body_id off"))
		sig := sangho.Sign(time.Now(), []byte(body), secret1)
		for _, id := range []string{"evt_r1", "evt_r2", "evt_r3", "evt_r4"} {
			if st := post(s.url, sig, id); st != 200 {
				t.Errorf("%s: %d, want 200", id, st)
			}
		}
		reached := len(l.Received())
		if reached != 1 {
			t.Errorf("%d events reached the backend, want 1", reached)
		}
	})
}

// TestServerNoUpstreamsAvailableIsReleased pins neverForwarded's match
// of reverse_proxy's "no upstreams available" (an unexported error
// matched by its text) on the real reverse_proxy: its only upstream is
// down and marked unhealthy by passive health checks after one failed
// dial, so the next event is answered 503 without any attempt to reach
// it. That event must be released (Sangho's retry is processed at once),
// not held until lock_ttl (which would answer the retry 409).
func TestServerNoUpstreamsAvailableIsReleased(t *testing.T) {
	dead := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := startCaddy(t, `	sangho_dedup {
		secret `+secret1+`
	}
	reverse_proxy `+dead+` {
		fail_duration 1m
		max_fails 1
	}
	handle_errors {
		respond "{http.sangho_dedup.outcome}" {http.error.status_code}
	}`)
	if a := send(t, s.url, eventBody("evt_dial"), ""); a.status != 502 || a.body != "released" {
		t.Fatalf("backend down (dial error): %d %q, want 502 released", a.status, a.body)
	}
	for i := range 2 {
		a := send(t, s.url, eventBody("evt_no_upstream"), "")
		if a.status != 503 || a.body != "released" {
			t.Fatalf("no upstream available, attempt %d: %d %q, want 503 released (reverse_proxy's error text changed?)", i+1, a.status, a.body)
		}
	}
}

// retryingProxy is reverse_proxy to first, then second (first marked
// down for a minute once it fails), a POST retried once whatever the
// error (lb_retry_match).
func retryingProxy(first, second string) string {
	return `	reverse_proxy ` + first + ` ` + second + ` {
		lb_policy first
		fail_duration 1m
		lb_retries 1
		lb_retry_match {
			method POST
		}
	}`
}

// retryErrors answers a refused delivery with its outcome and the
// retries reverse_proxy made.
const retryErrors = `	handle_errors {
		respond "{http.sangho_dedup.outcome} {http.reverse_proxy.retries}" {http.error.status_code}
	}`

// TestServerRetryAfterASentAttemptHolds: reverse_proxy set to retry a
// POST (lb_retry_match) sends the event to its first upstream, which
// drops the connection (the event's fate unknown), then to a second
// that refuses the dial. The last error is a dial error, but an earlier
// attempt may have reached a backend: the event is held, not released
// (released, Sangho's retry went to the backend at once, unmarked). A
// retry after dial errors only is still released (both upstreams
// refusing, TestServerNoUpstreamsAvailableIsReleased's other half).
func TestServerRetryAfterASentAttemptHolds(t *testing.T) {
	l := ledger.New(t)
	l.Behave(func(id string, n int) ledger.Action { return ledger.Action{Crash: id == "evt_sent" && n == 1} })
	dead, dead2 := "127.0.0.1:"+strconv.Itoa(freePort(t)), "127.0.0.1:"+strconv.Itoa(freePort(t))
	s := startCaddy(t, `	handle /dialonly {
		sangho_dedup {
			secret `+secret1+`
			store memory
		}
		reverse_proxy `+dead+` `+dead2+` {
			lb_policy first
			lb_retries 1
			lb_retry_match {
				method POST
			}
		}
	}
	handle {
		sangho_dedup {
			secret `+secret1+`
			store memory
		}
`+retryingProxy(l.Addr, dead)+`
	}
`+retryErrors)
	if a := send(t, s.url, eventBody("evt_sent"), "evt_sent"); a.status != 502 || a.body != "held 1" {
		t.Fatalf("sent to the first upstream (dropped), then a dial error: %d %q, want 502 held 1", a.status, a.body)
	}
	if a := send(t, s.url, eventBody("evt_sent"), "evt_sent"); a.status != 409 {
		t.Fatalf("Sangho's retry: %d %q, want 409 (held until lock_ttl)", a.status, a.body)
	}
	if got, _ := l.Counts("evt_sent"); got != 1 {
		t.Fatalf("the ledger got the event %d times, want 1", got)
	}
	dialOnly := strings.TrimSuffix(s.url, "/webhook") + "/dialonly"
	for i := range 2 {
		if a := send(t, dialOnly, eventBody("evt_dial_retried"), ""); a.status != 502 || a.body != "released 1" {
			t.Fatalf("two dial errors, attempt %d: %d %q, want 502 released 1", i+1, a.status, a.body)
		}
	}
}

// TestServerRetryAfterASentEmptyBodyHolds: the same with an empty body
// (github: the ID from X-GitHub-Delivery), which reverse_proxy sends
// without reading it (a request of Content-Length 0 goes with a nil
// body): the attempt that reached the backend still holds the event.
func TestServerRetryAfterASentEmptyBodyHolds(t *testing.T) {
	var got atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		c, _, err := w.(http.Hijacker).Hijack() // the backend got it, then its connection dropped
		if err == nil {
			c.Close()
		}
	}))
	t.Cleanup(backend.Close)
	dead := "127.0.0.1:" + strconv.Itoa(freePort(t))
	s := startCaddy(t, `	sangho_dedup {
		provider github
		secret "`+ghSecret1+`"
		store memory
	}
`+retryingProxy(strings.TrimPrefix(backend.URL, "http://"), dead)+"\n"+retryErrors)
	post := func() answer {
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(""))
		req.Header.Set("X-Hub-Signature-256", githubSig("", ghSecret1))
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0001")
		req.Header.Set("X-GitHub-Event", "ping")
		return do(t, req)
	}
	if a := post(); a.status != 502 || a.body != "held 1" {
		t.Fatalf("sent to the first upstream (dropped), then a dial error: %d %q, want 502 held 1", a.status, a.body)
	}
	if a := post(); a.status != 409 {
		t.Fatalf("the retry: %d %q, want 409 (held until lock_ttl)", a.status, a.body)
	}
	if n := got.Load(); n != 1 {
		t.Fatalf("the backend got the event %d times, want 1", n)
	}
}

// TestServerLoadWarnings: a config that is allowed but gives something
// up is logged at warn level when Caddy loads it, with the facts and
// without any secret: a retention shorter than Sangho's 48 h redelivery
// window, and a secret that holds a placeholder inside other text (taken
// literally).
func TestServerLoadWarnings(t *testing.T) {
	logFile := t.TempDir() + "/caddy.log"
	port := freePort(t)
	cfg, _ := adaptCaddyfile(t, fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output file %s
		level WARN
	}
}
http://127.0.0.1:%d {
	bind 127.0.0.1
	sangho_dedup {
		secret %s whsec_lit_{env.SANGHO_TEST_UNUSED}
		retention 24h
		store memory
	}
	respond "ok"
}`, logFile, port, secret1))
	if err := caddyLoad(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	entries, data := logEntries(t, logFile)
	var retention, literal bool
	for _, e := range entries {
		if e["logger"] != "http.handlers.sangho_dedup" {
			continue
		}
		msg, _ := e["msg"].(string)
		switch {
		case msg == "retention shorter than redelivery window":
			retention = e["level"] == "warn" && e["retention"] == float64(24*3600) && e["redelivery_window"] == float64(48*3600) // seconds, as Caddy encodes durations
		case msg == "secret taken literally":
			literal = e["level"] == "warn" && e["secret"] == float64(2)
		}
	}
	if !retention || !literal {
		t.Errorf("warnings (retention %v, literal secret %v) not as expected in the log:\n%s", retention, literal, data)
	}
	if strings.Contains(data, secret1) || strings.Contains(data, "whsec_lit_") {
		t.Errorf("the log holds a secret:\n%s", data)
	}
}

// bodyCounter is a fallback backend for error routes: it counts the
// requests it gets, and those that carry a body.
type bodyCounter struct {
	url             string
	requests, given atomic.Int64
}

func newBodyCounter(t *testing.T) *bodyCounter {
	t.Helper()
	c := &bodyCounter{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.requests.Add(1)
		if len(b) > 0 {
			c.given.Add(1)
		}
		w.WriteHeader(http.StatusOK) // a fallback that would process what it got
	}))
	t.Cleanup(srv.Close)
	c.url = strings.TrimPrefix(srv.URL, "http://")
	return c
}

// TestServerErrorRoutesNeverGetTheEvent: a delivery that sangho_dedup
// rejects (a bad signature, a failing store under on_store_error
// reject), or that it releases or holds after the backend failed, goes
// to the server's error routes as a Caddy error. A failover there
// (handle_errors { reverse_proxy fallback }) got the event's body and
// processed it unchecked: forged, or twice, or beside a backend still
// at work. The error routes now run (they can shape the answer) with
// an empty body.
func TestServerErrorRoutesNeverGetTheEvent(t *testing.T) {
	dead := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	for _, c := range []struct {
		name, site, errors string
		send               func(t *testing.T, url string)
	}{
		{"forged signature", dedupSite(dead(), "store memory"), "handle_errors", func(t *testing.T, url string) {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(bodyA))
			req.Header.Set("Sangho-Signature", "t="+strconv.FormatInt(time.Now().Unix(), 10)+",v1="+strings.Repeat("0", 64))
			do(t, req)
		}},
		{"store failing, on_store_error reject", dedupSite(dead(), redisStoreLine(dead())), "handle_errors 5xx", func(t *testing.T, url string) {
			send(t, url, bodyA, "")
		}},
		{"backend down, released", dedupSite(dead(), "store memory"), "handle_errors 5xx", func(t *testing.T, url string) {
			send(t, url, bodyA, "")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fallback := newBodyCounter(t)
			s := startCaddy(t, c.site+"\n\t"+c.errors+" {\n\t\treverse_proxy "+fallback.url+"\n\t}")
			for range 2 {
				c.send(t, s.url)
			}
			if fallback.requests.Load() == 0 {
				t.Fatal("the error route never ran: the test proves nothing")
			}
			if n := fallback.given.Load(); n != 0 {
				t.Fatalf("the error route's reverse_proxy passed the delivery's body on %d times of %d", n, fallback.requests.Load())
			}
		})
	}
}
