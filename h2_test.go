package sanghodedup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// TestServerOverHTTP2: Sangho delivers to an HTTPS endpoint, where
// Caddy and the sender's client agree on HTTP/2: each delivery is a
// stream of one shared connection, its body in DATA frames with or
// without a content-length, and a sender that gives up resets its
// stream (during its body, or while the backend works: then the lease is
// held, as when an HTTP/1.1 client goes away). The answers are those of
// HTTP/1.1.
func TestServerOverHTTP2(t *testing.T) {
	ownDataDir(t)
	certs := t.TempDir() // Caddy's storage: its local CA and the site's certificate
	l := ledger.New(t)
	l.Behave(func(id string, n int) ledger.Action {
		if strings.HasPrefix(id, "evt_h2_slow") {
			return ledger.Action{Delay: 300 * time.Millisecond}
		}
		return ledger.Action{}
	})
	port := freePort(t)
	cfg, _ := adaptCaddyfile(t, fmt.Sprintf(`{
	admin off
	persist_config off
	auto_https disable_redirects
	local_certs
	skip_install_trust
	servers {
		protocols h1 h2
	}
	storage file_system %s
	log {
		output discard
	}
}
https://127.0.0.1:%d {
	bind 127.0.0.1
	tls internal
%s
}
`, certs, port, dedupSite(l.Addr, "max_body_size 2KiB")))
	if err := caddyLoad(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	// Trust Caddy's own local CA, as a sender trusts a public one (Caddy
	// creates it, and the site's certificate, in the background).
	rootFile := filepath.Join(certs, "pki", "authorities", "local", "root.crt")
	waitFor(t, "Caddy's local CA", func() bool { _, err := os.Stat(rootFile); return err == nil })
	root, err := os.ReadFile(rootFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(root) {
		t.Fatal("Caddy's local root certificate: no PEM")
	}
	var dials atomic.Int64
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		}}
	defer tr.CloseIdleConnections()
	h2 := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	url := fmt.Sprintf("https://127.0.0.1:%d/webhook", port)
	waitFor(t, "the site's certificate", func() bool {
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err == nil {
			conn.Close()
		}
		return err == nil
	})

	post := func(ctx context.Context, id string, body io.Reader, length int64) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
		req.ContentLength = length
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Sangho-Event-ID", id)
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(eventBody(id)), secret1))
		resp, err := h2.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.ProtoMajor != 2 {
			t.Errorf("%s: answered over %s, want HTTP/2", id, resp.Proto)
		}
		return fmt.Sprintf("%d %s %s", resp.StatusCode, resp.Header.Get("Sangho-Dedup"), b), nil
	}
	deliver := func(id string, length int64) string {
		body := eventBody(id)
		var r io.Reader = strings.NewReader(body)
		if length < 0 {
			r = io.MultiReader(r) // no length known: DATA frames until END_STREAM
		}
		a, err := post(context.Background(), id, r, length)
		if err != nil {
			return err.Error()
		}
		return a
	}

	for _, c := range []struct {
		name   string
		length int64
	}{{"with a content-length", -2}, {"without one", -1}} {
		id := "evt_h2_" + strings.ReplaceAll(c.name, " ", "_")
		length := c.length
		if length == -2 {
			length = int64(len(eventBody(id)))
		}
		if a := deliver(id, length); !strings.HasPrefix(a, "200  ") {
			t.Errorf("new event %s: %s, want 200 from the backend", c.name, a)
		}
		if a := deliver(id, length); a != `200 duplicate {"received":true}` {
			t.Errorf("its redelivery %s: %s, want 200 duplicate", c.name, a)
		}
		if rec, _ := l.Counts(id); rec != 1 {
			t.Errorf("%s: the backend received it %d times, want 1", c.name, rec)
		}
	}

	big := `{"id":"evt_h2_big","pad":"` + strings.Repeat("x", 3000) + `"}`
	for _, length := range []int64{int64(len(big)), -1} {
		req, _ := http.NewRequest(http.MethodPost, url, io.MultiReader(strings.NewReader(big)))
		req.ContentLength = length
		req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(big), secret1))
		resp, err := h2.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Errorf("body over max_body_size, length %d: %d, want 413", length, resp.StatusCode)
		}
	}

	// Twenty deliveries of one event as streams of one connection.
	const id = "evt_h2_slow_concurrent"
	dialsBefore := dials.Load()
	var wg sync.WaitGroup
	answers := make([]string, 20)
	for i := range answers {
		wg.Go(func() { answers[i] = deliver(id, int64(len(eventBody(id)))) })
	}
	wg.Wait()
	if n := dials.Load() - dialsBefore; n != 0 {
		t.Errorf("the concurrent deliveries opened %d connections, want none: streams of the one open", n)
	}
	passed := 0
	for _, a := range answers {
		switch {
		case strings.HasPrefix(a, "200  "):
			passed++
		case a == `200 duplicate {"received":true}`, strings.HasPrefix(a, "409 in_flight"):
		default:
			t.Errorf("concurrent delivery: %s", a)
		}
	}
	if rec, _ := l.Counts(id); passed != 1 || rec != 1 {
		t.Errorf("concurrent deliveries: %d passed on, the backend received %d, want 1 and 1", passed, rec)
	}

	// A sender that gives up half-way through its body resets the
	// stream: nothing reaches the backend, and no lease is left behind.
	const cut = "evt_h2_cut"
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		_, err := post(ctx, cut, pr, int64(len(eventBody(cut))))
		errc <- err
	}()
	b := eventBody(cut)
	if _, err := io.WriteString(pw, b[:len(b)/2]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the half is on its way
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cut delivery got an answer")
	}
	pw.Close()
	if a := deliver(cut, int64(len(b))); !strings.HasPrefix(a, "200  ") {
		t.Errorf("the delivery after a reset stream: %s, want 200 from the backend (no lease left)", a)
	}
	if rec, _ := l.Counts(cut); rec != 1 {
		t.Errorf("the cut event reached the backend %d times, want 1", rec)
	}

	// A sender that resets its stream while the backend works on the
	// event (the backend finishes it): the fate is unknown to Caddy, so
	// the lease is held, not released: a redelivery meanwhile, and after
	// the backend is done, gets 409 in_flight, and the event reached the
	// backend once.
	const gone = "evt_h2_slow_gone"
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		_, err := post(ctx, gone, strings.NewReader(eventBody(gone)), int64(len(eventBody(gone))))
		errc <- err
	}()
	waitFor(t, "the backend to get the event", func() bool { rec, _ := l.Counts(gone); return rec == 1 })
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the reset delivery got an answer")
	}
	if a := deliver(gone, int64(len(eventBody(gone)))); !strings.HasPrefix(a, "409 in_flight") {
		t.Errorf("a redelivery while the backend works: %s, want 409 in_flight", a)
	}
	waitFor(t, "the backend to finish the event", func() bool { _, done := l.Counts(gone); return done == 1 })
	if a := deliver(gone, int64(len(eventBody(gone)))); !strings.HasPrefix(a, "409 in_flight") {
		t.Errorf("a redelivery after the backend finished: %s, want 409 in_flight (held until lock_ttl)", a)
	}
	if rec, _ := l.Counts(gone); rec != 1 {
		t.Errorf("the reset event reached the backend %d times, want 1", rec)
	}
}
