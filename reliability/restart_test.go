package reliability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// leases returns the keys that hold an in-flight lease in the Redis at
// addr.
func leases(t *testing.T, addr string) []string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	var out []string
	iter := c.Scan(ctx, 0, "sangho_dedup:*", 1000).Iterator()
	for iter.Next(ctx) {
		v, err := c.Get(ctx, iter.Val()).Result()
		if err == nil && strings.HasPrefix(v, "inflight:") {
			out = append(out, iter.Val())
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("scanning Redis for leases: %v", err)
	}
	return out
}

// deliverOnce sends one signed delivery of event id and returns the
// status and the Sangho-Dedup header (status 0: no answer).
func deliverOnce(client *http.Client, url, id string) (int, string) {
	body := []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":"payment_intent.succeeded"}`, id))
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Sangho-Event-ID", id)
	req.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), body, secret))
	resp, err := client.Do(req)
	if err != nil {
		return 0, ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Sangho-Dedup")
}

// TestGracefulStop: Caddy is asked to stop (SIGTERM, `caddy stop`)
// while the backend works on a batch of events; a third of them end in
// a backend 500, the rest in 200. Requests that finish within Caddy's
// grace period must be settled before the process exits: no lease left
// in Redis, so that right after the restart a redelivery of a 500'd
// event is processed at once (not 409 until lock_ttl, 30 s here) and a
// redelivery of a 200'd event is a duplicate.
func TestGracefulStop(t *testing.T) {
	for _, c := range []struct {
		name, global string
		stop         func(*caddyProc, *testing.T)
	}{
		{"SIGTERM, eternal grace period", "", (*caddyProc).terminate},
		{"caddy stop, grace_period 10s", "grace_period 10s", (*caddyProc).stop},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := redistest.Start(t)
			l := ledger.New(t)
			l.Behave(func(id string, n int) ledger.Action {
				switch {
				case n > 1:
					return ledger.Action{}
				case strings.ContainsAny(id[len(id)-1:], "036"): // a third of the events fail
					return ledger.Action{Status: 500, Delay: 800 * time.Millisecond}
				}
				return ledger.Action{Delay: 800 * time.Millisecond}
			})
			p := startCaddyGlobal(t, c.global, siteConfigTimeout(redisStore(r.Addr), l.Addr, "lock_ttl 30s", 10*time.Second))
			client := &http.Client{Timeout: 30 * time.Second}
			m := 24 * scale
			ids := make([]string, m)
			first := make([]int, m)
			var wg sync.WaitGroup
			for i := range m {
				ids[i] = fmt.Sprintf("evt_stop_%05d", i)
				wg.Add(1)
				go func() { defer wg.Done(); first[i], _ = deliverOnce(client, p.url, ids[i]) }()
			}
			// Stop once every event is at the backend.
			deadline := time.Now().Add(30 * time.Second)
			for received, _ := l.Totals(); received < m; received, _ = l.Totals() {
				if time.Now().After(deadline) {
					t.Fatalf("only %d of %d events reached the backend within 30s", received, m)
				}
				time.Sleep(5 * time.Millisecond)
			}
			c.stop(p, t)
			wg.Wait()

			var ok2xx, non2xx, cut int
			for _, s := range first {
				switch {
				case s >= 200 && s < 300:
					ok2xx++
				case s == 0:
					cut++
				default:
					non2xx++
				}
			}
			left := leases(t, r.Addr)

			p.restart(t)
			var redone, dup, conflicts, other int
			for i, id := range ids {
				status, dedup := deliverOnce(client, p.url, id)
				switch {
				case status == 409:
					conflicts++
				case first[i] >= 200 && first[i] < 300 && status == 200 && dedup == "duplicate":
					dup++
				case (first[i] < 200 || first[i] >= 300) && status == 200 && dedup == "":
					redone++
				default:
					other++
					t.Errorf("%s: first answered %d, redelivery after the restart answered %d %q", id, first[i], status, dedup)
				}
			}
			fig := fmt.Sprintf("%d events at the backend when stopped: answered 2xx %d, non-2xx %d, cut off %d; leases left in Redis %d; after the restart: non-2xx ones processed at once %d, 2xx ones answered as duplicates %d, 409 %d",
				m, ok2xx, non2xx, cut, len(left), redone, dup, conflicts)
			t.Logf("%s: %s", c.name, fig)
			fmt.Printf("FIGURES graceful stop (%s): %s\n", c.name, fig)
			if cut > 0 {
				t.Errorf("%d requests got no answer although they finish within the grace period", cut)
			}
			if len(left) > 0 {
				t.Errorf("%d leases of settled events left in Redis after the stop, e.g. %v", len(left), head(left))
			}
			if conflicts > 0 {
				t.Errorf("%d redeliveries answered 409 after the restart: a lease outlived the stop", conflicts)
			}
			if non2xx == 0 || ok2xx == 0 {
				t.Errorf("the batch did not mix outcomes (%d 2xx, %d non-2xx)", ok2xx, non2xx)
			}
			for _, id := range ids {
				if _, done := l.Counts(id); done != 1 {
					t.Errorf("%s processed %d times", id, done)
				}
			}
		})
	}
}

// TestRollingRestart: three instances behind Sangho's retries are
// stopped (SIGTERM) and started again one at a time while events
// stream through them.
func TestRollingRestart(t *testing.T) {
	r := redistest.Start(t)
	l := ledger.New(t)
	l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 50 * time.Millisecond} })
	site := siteConfigTimeout(redisStore(r.Addr), l.Addr, "", 10*time.Second)
	var procs []*caddyProc
	var urls []string
	for range 3 {
		p := startCaddy(t, site)
		procs = append(procs, p)
		urls = append(urls, p.url)
	}
	s := newSender(urls, 2)
	n := 150 * scale
	var restarted atomic.Int64
	ids, acked := s.run("rolling", n, func(prog *atomic.Int64) {
		for i, p := range procs {
			at(prog, int64(2*n*(i+1)/5), func() {
				s.fig.faults.Add(1)
				p.terminate(t)
				p.restart(t)
				restarted.Add(1)
			})
		}
	})
	f := check(t, "rolling restart of 3 instances (SIGTERM, start again)", s, l, ids, acked, false)
	if restarted.Load() != 3 {
		t.Errorf("%d of 3 instances restarted during the run", restarted.Load())
	}
	if n := f.unavailable.Load() + f.otherNon2xx.Load(); n > 0 {
		t.Errorf("%d 5xx or other non-2xx answers during a rolling restart with Redis and the backend healthy", n)
	}
}

// TestReloadStoreConfigUnderLoad: the store config is changed by
// `caddy reload` (through the admin API) while events are in flight:
// another pool_size, another address of the same Redis (through a
// pass-through proxy) and back. Each change gives the new config a new
// Redis client; the old config's requests in flight must still settle.
func TestReloadStoreConfigUnderLoad(t *testing.T) {
	r := redistest.Start(t)
	via := startProxy(t, r.Addr)
	l := ledger.New(t)
	l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 200 * time.Millisecond} })
	site := func(store string) string {
		return siteConfigTimeout(store, l.Addr, "", 10*time.Second)
	}
	stores := []string{
		strings.Replace(redisStore(r.Addr), "\n\t\t}", "\n\t\t\tpool_size 7\n\t\t}", 1),
		redisStore(via.Addr()),
		redisStore(r.Addr),
		strings.Replace(redisStore(via.Addr()), "\n\t\t}", "\n\t\t\tpool_size 5\n\t\t}", 1),
		redisStore(r.Addr),
	}
	p := startCaddy(t, site(redisStore(r.Addr)))
	s := newSender([]string{p.url}, 3)
	n := 150 * scale
	ids, acked := s.run("reload_store", n, func(prog *atomic.Int64) {
		for i, st := range stores {
			at(prog, int64(n*3*(i+1)/7), func() {
				s.fig.faults.Add(1)
				if err := p.reload(site(st)); err != nil {
					t.Errorf("reload %d: %v", i, err)
				}
			})
		}
	})
	check(t, "store config reloaded 5 times under load (pool_size, address and back)", s, l, ids, acked, false)
}

// TestReloadThenExitServesRequestOnTheWay: a delivery is held in
// forward_auth (a slow auth service) before sangho_dedup when a reload
// gives the endpoint another store, then Caddy is told to exit (SIGTERM)
// before the auth service answers. Caddy's exit waits for the old
// server's request; when it reaches the old config's sangho_dedup, its
// store (kept for the reload's linger) must still be open: it is
// processed and recorded there, not refused 503 because Caddy exiting
// closed the store under it.
func TestReloadThenExitServesRequestOnTheWay(t *testing.T) {
	l := ledger.New(t)
	var authCalls atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) } // lets every check through
	defer open()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	auth := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authCalls.Add(1)
		<-release
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = auth.Serve(ln) }()
	defer auth.Close()
	authAddr := ln.Addr().String()

	dir := t.TempDir()
	site := func(path string) string {
		return "\troute {\n\t\tforward_auth " + authAddr + " {\n\t\t\turi /check\n\t\t}\n" +
			siteConfig("store file {\n\t\t\tpath "+dir+"/"+path+"\n\t\t}", l.Addr, "") + "\n\t}"
	}
	// Caddy's http logger at INFO too, beside the harness's WARN log: its
	// "servers shutting down" line of the exit says that no config runs
	// any more and that the exit's stop is under way.
	p := startCaddyGlobal(t, "log stopping {\n\t\tlevel INFO\n\t\tinclude http\n\t}", site("a.db"))
	client := &http.Client{Timeout: 30 * time.Second}
	const id = "evt_reload_exit"
	type reply struct {
		status int
		dedup  string
	}
	got := make(chan reply, 1)
	go func() {
		status, dedup := deliverOnce(client, p.url, id)
		got <- reply{status, dedup}
	}()
	poll.Until(t, 10*time.Second, "the delivery to reach forward_auth", func() bool { return authCalls.Load() == 1 })
	if err := p.reload(site("b.db")); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The reload stopped the old server, the exit stops the new one: the
	// second "servers shutting down" is the exit's, logged once Caddy
	// runs no config, so that a store released then is released by the
	// exit. (Before the fix the old store was closed then, within one
	// poll of its linger, 50 ms.)
	poll.Until(t, 10*time.Second, "Caddy's exit to stop its servers", func() bool {
		b, _ := os.ReadFile(p.log)
		_, exit, ok := bytes.Cut(b, []byte("exiting"))
		return ok && bytes.Contains(exit, []byte("servers shutting down"))
	})
	// Five of the linger's polls, for a store the exit would release.
	time.Sleep(250 * time.Millisecond)
	open() // the auth service lets the delivery through
	if r := <-got; r.status != 200 || r.dedup != "" {
		t.Errorf("the delivery held across the reload and the exit: %d %q, want 200 from the backend", r.status, r.dedup)
	}
	p.waitExit(t)
	if rec, _ := l.Counts(id); rec != 1 {
		t.Fatalf("the backend received the event %d times, want 1", rec)
	}
	// Recorded on the old config's store: Caddy started again on it (the
	// config file still names a.db) answers a redelivery as a duplicate.
	p.restart(t)
	if status, dedup := deliverOnce(client, p.url, id); status != 200 || dedup != "duplicate" {
		t.Errorf("the event again on the old config's store: %d %q, want 200 duplicate", status, dedup)
	}
}

// TestLateRequestAfterTheLingerIsRefused: a delivery held in forward_auth
// before sangho_dedup across a reload that keeps the store (the same
// file), and past the old config's linger (10 s), reaches the old
// config's sangho_dedup, whose use of the store was released: the new
// config holds the file, but counts no use for this delivery, and a
// reload to another file closes it under the delivery. It is refused
// (503), and the sender's retry is processed once on the config running.
// (Found by review: it was served, its commit failed on the closed
// store, and after a reload back the retry was processed again.)
func TestLateRequestAfterTheLingerIsRefused(t *testing.T) {
	l := ledger.New(t)
	l.Behave(func(id string, n int) ledger.Action {
		if n == 1 { // longer than the linger of the reload that closes the file
			return ledger.Action{Delay: 14 * time.Second}
		}
		return ledger.Action{}
	})
	var authCalls atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	auth := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if authCalls.Add(1) == 1 {
			<-release
		}
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = auth.Serve(ln) }()
	defer auth.Close()
	dir := t.TempDir()
	site := func(path, ttl string) string {
		return "\troute {\n\t\tforward_auth " + ln.Addr().String() + " {\n\t\t\turi /check\n\t\t}\n" +
			siteConfigTimeout("store file "+dir+"/"+path, l.Addr, "lock_ttl "+ttl, 30*time.Second) + "\n\t}"
	}
	p := startCaddy(t, site("a.db", "2s"))
	client := &http.Client{Timeout: 60 * time.Second}
	const id = "evt_late_use"
	got := make(chan [2]any, 1)
	go func() { s, d := deliverOnce(client, p.url, id); got <- [2]any{s, d} }()
	poll.Until(t, 10*time.Second, "the delivery to reach forward_auth", func() bool { return authCalls.Load() == 1 })
	if err := p.reload(site("a.db", "3s")); err != nil { // the same file: the new config shares it
		t.Fatal(err)
	}
	time.Sleep(storepool.DefaultReloadLinger + time.Second) // the old config's linger is over
	open()
	var first [2]any
	poll.Until(t, 10*time.Second, "the delivery to reach the backend or be answered", func() bool {
		if r, _ := l.Counts(id); r == 1 {
			return true
		}
		select {
		case first = <-got:
			return true
		default:
			return false
		}
	})
	if err := p.reload(site("b.db", "3s")); err != nil { // a.db no longer used: closed after this reload's linger
		t.Fatal(err)
	}
	if first == [2]any{} {
		first = <-got
	}
	if first[0] != http.StatusServiceUnavailable {
		t.Errorf("the delivery that reached the old config after its linger: %v, want 503", first)
	}
	if b, _ := os.ReadFile(p.log); !bytes.Contains(b, []byte(storepool.ErrUnloaded.Error())) {
		t.Errorf("the log does not say why the delivery was refused (%q)", storepool.ErrUnloaded)
	}
	if err := p.reload(site("a.db", "2s")); err != nil { // back to a.db
		t.Fatal(err)
	}
	var status int
	poll.Until(t, 30*time.Second, "the retry to be answered other than 409", func() bool {
		// 0: no answer, a keep-alive connection the reload closed (a
		// POST is not retried by Go's client): send again, as Sangho does.
		status, _ = deliverOnce(client, p.url, id)
		return status != http.StatusConflict && status != 0
	})
	if _, done := l.Counts(id); done != 1 {
		t.Errorf("the event was processed %d times, want 1 (first answer %v, the retry's %d): %+v", done, first, status, l.Deliveries(id))
	}
}
