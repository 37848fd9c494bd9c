package sanghodedup

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
)

// Deliveries that reach the application through something that answers
// for it: a gateway between Caddy and the application (nginx, an
// ingress, a cloud load balancer), or reverse_proxy's own retries. Their
// statuses are not the application's word on the event.

// TestServerGatewayStatusIsHeld: a gateway between Caddy and the
// application answers 504 when the application is slower than its read
// timeout, 502 when the application's connection breaks: the application
// may have done the work, or may still be doing it. The event is held
// (409 until lock_ttl), and the retry after that goes on marked, so a
// backend that checks its records does not process it twice. (Found by
// review: released, the retry reached the application unmarked and was
// processed again.)
//
// A handler between sangho_dedup and the proxy may turn the gateway's
// answer into another (intercept, which Caddy orders after sangho_dedup,
// or the proxy's own replace_status or handle_response): the upstream's
// status ({http.reverse_proxy.status_code}) is held all the same. (Found
// by review: a 502 turned 500 was released, the event processed twice.)
func TestServerGatewayStatusIsHeld(t *testing.T) {
	intercept := "\tintercept {\n\t\t@5xx status 5xx\n\t\thandle_response @5xx {\n\t\t\trespond \"Something went wrong\" 500\n\t\t}\n\t}\n"
	// An error page served by another proxy: the status variable is then
	// the page server's 200, not the gateway's 502 (found by review: the
	// 500 written was released, the event processed twice).
	pages := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<h1>oops</h1>")) }))
	defer pages.Close()
	errorPage := "\tintercept {\n\t\t@5xx status 5xx\n\t\thandle_response @5xx {\n\t\t\theader -Content-Length\n\t\t\tmethod GET\n\t\t\trequest_body {\n\t\t\t\tset page\n\t\t\t}\n" +
		"\t\t\treverse_proxy " + strings.TrimPrefix(pages.URL, "http://") + " {\n\t\t\t\treplace_status 500\n\t\t\t}\n\t\t}\n\t}\n"
	for _, c := range []struct {
		name            string
		status, written int
		site            func(gateway string) string
	}{
		{"502", http.StatusBadGateway, http.StatusBadGateway, nil},
		{"504", http.StatusGatewayTimeout, http.StatusGatewayTimeout, nil},
		{"502 turned 500 by intercept", http.StatusBadGateway, http.StatusInternalServerError, func(gw string) string {
			return "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t\tlock_ttl 1500ms\n\t}\n" + intercept + "\treverse_proxy " + gw + "\n"
		}},
		{"502 turned into an error page from another proxy", http.StatusBadGateway, http.StatusInternalServerError, func(gw string) string {
			return "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t\tlock_ttl 1500ms\n\t}\n" + errorPage + "\treverse_proxy " + gw + "\n"
		}},
		{"504 turned 500 by replace_status", http.StatusGatewayTimeout, http.StatusInternalServerError, func(gw string) string {
			return "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t\tlock_ttl 1500ms\n\t}\n\treverse_proxy " + gw + " {\n\t\t@5xx status 5xx\n\t\treplace_status @5xx 500\n\t}\n"
		}},
	} {
		status := c.status
		t.Run(c.name, func(t *testing.T) {
			app := ledger.New(t)
			app.Behave(func(id string, n int) ledger.Action {
				if n == 1 { // slower than the gateway waits; it finishes all the same
					return ledger.Action{Delay: 600 * time.Millisecond, CheckIfMarked: true}
				}
				return ledger.Action{CheckIfMarked: true}
			})
			target, _ := url.Parse("http://" + app.Addr)
			gw := httputil.NewSingleHostReverseProxy(target)
			gw.Transport = &http.Transport{ResponseHeaderTimeout: 200 * time.Millisecond}
			gw.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) { w.WriteHeader(status) }
			gateway := httptest.NewServer(gw)
			defer gateway.Close()
			site := dedupSite(strings.TrimPrefix(gateway.URL, "http://"), "lock_ttl 1500ms")
			if c.site != nil {
				site = c.site(strings.TrimPrefix(gateway.URL, "http://"))
			}
			s := startCaddy(t, site)

			if a := send(t, s.url, eventBody("evt_gw"), "evt_gw"); a.status != c.written {
				t.Fatalf("first delivery: %d %q, want %d", a.status, a.body, c.written)
			}
			if a := send(t, s.url, eventBody("evt_gw"), "evt_gw"); a.status != http.StatusConflict || a.dedup != "in_flight" {
				t.Errorf("retry right after the gateway's %d: %d %q (Sangho-Dedup %q), want 409 in_flight", status, a.status, a.body, a.dedup)
			}
			poll.Until(t, 5*time.Second, "the application finishing the first delivery", func() bool {
				_, done := app.Counts("evt_gw")
				return done >= 1
			})
			// After lock_ttl the retry goes on, marked.
			var a answer
			poll.Until(t, 5*time.Second, "the retry after lock_ttl going on", func() bool {
				a = send(t, s.url, eventBody("evt_gw"), "evt_gw")
				return a.status != http.StatusConflict
			})
			if a.status != http.StatusOK {
				t.Errorf("retry after lock_ttl: %d %q", a.status, a.body)
			}
			if _, done := app.Counts("evt_gw"); done != 1 {
				t.Errorf("the application processed the event %d times: %+v", done, app.Deliveries("evt_gw"))
			}
			ds := app.Deliveries("evt_gw")
			if last := ds[len(ds)-1]; !last.Marked {
				t.Errorf("the retry after lock_ttl reached the application unmarked: %+v", ds)
			}
		})
	}
}

// TestServerFailoverAfterASentAttemptIsHeld: reverse_proxy with
// request_buffers and lb_retry_match retries a POST that reached its
// first upstream (the work done, the answer lost) on the next one. That
// one answers 503: its status tells nothing of the first attempt, which
// may have processed the event, so the event is held, not released.
// (Found by review: released, Sangho's retry was processed again,
// unmarked.)
func TestServerFailoverAfterASentAttemptIsHeld(t *testing.T) {
	var processedByA atomic.Int64
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		processedByA.Add(1) // the work is done and committed
		if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
			c.Close() // ... and the answer is lost
		}
	}))
	defer a.Close()
	b := ledger.New(t)
	b.Behave(func(id string, n int) ledger.Action {
		if n == 1 {
			return ledger.Action{Status: http.StatusServiceUnavailable} // overloaded: nothing done
		}
		return ledger.Action{}
	})
	s := startCaddy(t, `	sangho_dedup {
		secret `+secret1+`
		lock_ttl 1500ms
	}
	reverse_proxy `+strings.TrimPrefix(a.URL, "http://")+` `+b.Addr+` {
		lb_policy first
		fail_duration 1m
		lb_retries 1
		request_buffers 1MiB
		lb_retry_match {
			method POST
		}
	}`)
	first := send(t, s.url, eventBody("evt_failover"), "evt_failover")
	if processedByA.Load() != 1 {
		t.Fatalf("the first upstream got %d deliveries (answer %d %q)", processedByA.Load(), first.status, first.body)
	}
	if received, _ := b.Counts("evt_failover"); received != 1 {
		t.Fatalf("reverse_proxy did not retry on the second upstream (%d deliveries; answer %d %q)", received, first.status, first.body)
	}
	retry := send(t, s.url, eventBody("evt_failover"), "evt_failover")
	if retry.status != http.StatusConflict {
		t.Errorf("Sangho's retry: %d %q (Sangho-Dedup %q), want 409: the first upstream may have processed it", retry.status, retry.body, retry.dedup)
	}
	if _, done := b.Counts("evt_failover"); done != 0 {
		t.Errorf("processed again by the second upstream, unmarked: %+v", b.Deliveries("evt_failover"))
	}
}

// TestResendingProxyWarning: reverse_proxy with request_buffers replays
// the body, and with lb_retry_match (and lb_retries or lb_try_duration)
// it retries a delivery after it reached an upstream: the next upstream
// may process an event the first processed, inside one delivery, where
// no mark can reach it. Caddy accepts that config; sangho_dedup warns at
// load, naming what to drop. Retries after dial errors only (no
// lb_retry_match) are safe, and a retry without request_buffers sends
// no body again: no warning.
func TestResendingProxyWarning(t *testing.T) {
	for _, c := range []struct {
		name, proxy string
		want        bool
	}{
		{"request_buffers and lb_retry_match", "\t\tlb_retries 2\n\t\trequest_buffers 1MiB\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}\n", true},
		{"a response matcher", "\t\tlb_try_duration 5s\n\t\trequest_buffers 64KiB\n\t\tlb_retry_match {\n\t\t\texpression `{rp.status_code} in [502, 503]`\n\t\t}\n", true},
		{"request_buffers, dial errors only", "\t\tlb_retries 2\n\t\trequest_buffers 1MiB\n", false},
		{"lb_retry_match without request_buffers", "\t\tlb_retries 2\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}\n", false},
		{"request_buffers and lb_retry_match, no retries", "\t\trequest_buffers 1MiB\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}\n", false},
		// php_fastcgi buffers bodies up to 4 KiB by itself (its transport
		// sets request_buffers at load), and replays them (found by review).
		{"php_fastcgi with lb_retry_match", "php_fastcgi:\t\tlb_retries 2\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}\n", true},
		{"php_fastcgi, dial errors only", "php_fastcgi:\t\tlb_retries 2\n", false},
		// A retry match whose method matcher leaves POST out never
		// retries a delivery (left undone last session: it warned).
		{"lb_retry_match for GET and PUT only", "\t\tlb_retries 2\n\t\trequest_buffers 1MiB\n\t\tlb_retry_match {\n\t\t\tmethod GET PUT\n\t\t}\n", false},
		{"lb_retry_match, a second set for POST", "\t\tlb_retries 2\n\t\trequest_buffers 1MiB\n\t\tlb_retry_match {\n\t\t\tmethod GET\n\t\t}\n\t\tlb_retry_match {\n\t\t\tmethod post\n\t\t}\n", true},
		{"lb_retry_match, a path and GET", "\t\tlb_retries 2\n\t\trequest_buffers 1MiB\n\t\tlb_retry_match {\n\t\t\tpath /hooks/*\n\t\t\tmethod GET\n\t\t}\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			proxy, opts := "reverse_proxy", c.proxy
			if rest, ok := strings.CutPrefix(opts, "php_fastcgi:"); ok {
				proxy, opts = "php_fastcgi", rest
			}
			site := "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t}\n\t" + proxy + " 127.0.0.1:1 127.0.0.1:2 {\n" + opts + "\t}\n"
			got, data := siteWarnings(t, site, "", "reverse_proxy may send a delivery twice")
			if want := map[bool]int{true: 1, false: 0}[c.want]; got != want {
				t.Errorf("%d warnings, want %d:\n%s", got, want, data)
			}
		})
	}
	// Where the sites put the handler: a handle block, as the README's
	// sites write it; a named route (found by review: not seen); and a
	// resending proxy in another handle block of the site, which no
	// delivery reaches (found by review: warned about).
	const dedup = "sangho_dedup {\n\t\tsecret " + secret1 + "\n\t}\n"
	const resending = "reverse_proxy 127.0.0.1:1 127.0.0.1:2 {\n\t\tlb_retries 1\n\t\trequest_buffers 1MiB\n\t\tlb_retry_match {\n\t\t\tmethod POST\n\t\t}\n\t}\n"
	for _, c := range []struct {
		name, site, snippet string
		want                int
	}{
		{"in a handle block", "\thandle /webhook {\n\t" + dedup + "\t" + resending + "\t}\n", "", 1},
		// In a route block: Caddy's adapter keeps only the first directive
		// of a named route's several (see TestNamedRouteKeepsOnlyItsFirstDirective).
		{"in a named route", "\tinvoke hooks\n", "&(hooks) {\n\troute {\n\t" + dedup + "\t" + resending + "\t}\n}\n", 1},
		{"in another handle block", "\thandle /webhook {\n\t" + dedup + "\treverse_proxy 127.0.0.1:3\n\t}\n\thandle {\n\t" + resending + "\t}\n", "", 0},
		{"after a route that holds it", "\troute {\n\t" + dedup + "\t}\n\t" + resending, "", 1},
		// The handle block's own proxy answers: nothing after it runs for
		// a delivery (found by review: warned about).
		{"after a handle block whose proxy answers", "\thandle /webhook {\n\t" + dedup + "\treverse_proxy 127.0.0.1:3\n\t}\n\t" + resending, "", 0},
		{"after a handle block that responds", "\thandle /webhook {\n\t" + dedup + "\trespond 204\n\t}\n\t" + resending, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, data := siteWarnings(t, c.site, c.snippet, "reverse_proxy may send a delivery twice"); got != c.want {
				t.Errorf("%d warnings, want %d:\n%s%s\n%s", got, c.want, c.snippet, c.site, data)
			}
		})
	}
}

// TestServerAnotherUpstreamsTwoHundredIsNotTheBackends: the status
// variable a reverse_proxy sets is the last upstream's, whichever it
// was: an error page served by another proxy in intercept, after the
// backend's 500, or a forward_auth after sangho_dedup, before a backend
// that is down. Its 2xx is not the backend's answer: the event is not
// committed, and processed once. (Found by review of a change that
// committed on the variable's 2xx: both events were lost.) The error
// page's 500 is not the page server's status: which answer the backend
// gave is unknown, so that event is held, and its retry after lock_ttl
// goes on marked; the dial error is released.
func TestServerAnotherUpstreamsTwoHundredIsNotTheBackends(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("<h1>oops</h1>")) }))
	t.Cleanup(other.Close)
	otherAddr := strings.TrimPrefix(other.URL, "http://")
	dedup := "\tsangho_dedup {\n\t\tsecret " + secret1 + "\n\t}\n"
	t.Run("an error page from another upstream in intercept", func(t *testing.T) {
		l := ledger.New(t)
		var fail atomic.Bool
		fail.Store(true)
		l.Behave(func(id string, n int) ledger.Action {
			if fail.Load() {
				return ledger.Action{Status: http.StatusInternalServerError}
			}
			return ledger.Action{}
		})
		s := startCaddy(t, "\tsangho_dedup {\n\t\tsecret "+secret1+"\n\t\tlock_ttl 1s\n\t}\n"+"\tintercept {\n\t\t@5xx status 5xx\n\t\thandle_response @5xx {\n\t\t\theader -Content-Length\n\t\t\tmethod GET\n\t\t\trequest_body {\n\t\t\t\tset page\n\t\t\t}\n"+
			"\t\t\treverse_proxy "+otherAddr+" {\n\t\t\t\treplace_status 500\n\t\t\t}\n\t\t}\n\t}\n\treverse_proxy "+l.Addr+"\n")
		if a := send(t, s.url, eventBody("evt_page"), "evt_page"); a.status != http.StatusInternalServerError {
			t.Fatalf("first delivery, the backend failing: %d %q, want the error page's 500", a.status, a.body)
		}
		fail.Store(false)
		var a answer
		poll.Until(t, 5*time.Second, "the retry after lock_ttl going on", func() bool {
			a = send(t, s.url, eventBody("evt_page"), "evt_page")
			return a.status != http.StatusConflict
		})
		if a.status != http.StatusOK || a.dedup != "" {
			t.Errorf("retry after lock_ttl, the backend healthy: %d %q (Sangho-Dedup %q), want the backend's 200", a.status, a.body, a.dedup)
		}
		if _, done := l.Counts("evt_page"); done != 1 {
			t.Errorf("the backend processed the event %d times, want 1", done)
		}
		if ds := l.Deliveries("evt_page"); !ds[len(ds)-1].Marked {
			t.Errorf("the retry after lock_ttl reached the backend unmarked: %+v", ds)
		}
	})
	t.Run("forward_auth after sangho_dedup, the backend down", func(t *testing.T) {
		site := func(backend string) string {
			return "\troute {\n\t" + dedup + "\t\tforward_auth " + otherAddr + " {\n\t\t\turi /auth\n\t\t}\n\t\treverse_proxy " + backend + "\n\t}\n"
		}
		s := startCaddy(t, site("127.0.0.1:"+strconv.Itoa(freePort(t))))
		if a := send(t, s.url, eventBody("evt_fa"), "evt_fa"); a.status != http.StatusBadGateway {
			t.Fatalf("first delivery, the backend down: %d %q, want 502", a.status, a.body)
		}
		l := ledger.New(t)
		s.load(t, site(l.Addr))
		if a := send(t, s.url, eventBody("evt_fa"), "evt_fa"); a.status != http.StatusOK || a.dedup != "" {
			t.Errorf("retry, the backend up: %d %q (Sangho-Dedup %q), want the backend's 200", a.status, a.body, a.dedup)
		}
		if _, done := l.Counts("evt_fa"); done != 1 {
			t.Errorf("the backend processed the event %d times, want 1", done)
		}
	})
}

// TestHeldLogNamesTheUpstreamsStatus: a non-2xx answer that is not the
// last upstream's status is held, and the "event held" line gives both:
// the status the sender got, and the upstream's. A gateway's 502 turned
// 500 (intercept) is held as a gateway's; a 200 behind a 500 (a page
// from another proxy, or the backend's 2xx rewritten) is held as a
// rewrite: whose answer the 500 replaced is unknown.
func TestHeldLogNamesTheUpstreamsStatus(t *testing.T) {
	for _, c := range []struct {
		upstream int
		cause    string
	}{
		{http.StatusBadGateway, "a gateway's answer"},
		{http.StatusOK, "not the last upstream's"},
	} {
		h, logs := newTestHandler(t, nil)
		body := eventBody("evt_held_" + strconv.Itoa(c.upstream))
		w, repl, _ := serve(h, signedRequest(body, ""), caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).Set(proxyStatusVar, c.upstream) // as reverse_proxy does
			w.WriteHeader(http.StatusInternalServerError)                                             // as intercept does
			return nil
		}))
		if w.Code != http.StatusInternalServerError || outcomeOf(repl) != outcomeHeld {
			t.Fatalf("upstream %d: %d %q, want 500 held", c.upstream, w.Code, outcomeOf(repl))
		}
		held := logs.FilterMessage("event held").AllUntimed()
		if len(held) != 1 {
			t.Fatalf("upstream %d: %d event held lines, want 1", c.upstream, len(held))
		}
		f := held[0].ContextMap()
		if f["status"] != int64(500) || f["upstream_status"] != int64(c.upstream) || !strings.Contains(fmt.Sprint(f["cause"]), c.cause) {
			t.Errorf("event held: %v, want status 500, upstream_status %d, cause %q", f, c.upstream, c.cause)
		}
	}
}
