// Package handlertest is a test kit, imported by tests only: it runs the
// sangho_dedup handler as Caddy does, in a store's own package, for the
// tests that prove what that store does under the handler (a stalled
// disk, a refused ACL, ...). The root package's own tests cannot import
// it (it imports the root package); they keep their helpers.
package handlertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile" // the Caddyfile adapter
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/standard" // respond, reverse_proxy, ...

	sanghodedup "github.com/sangho/caddy-sangho-dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/poll"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// Secret is the Sangho secret of the kit's handlers and requests.
const Secret = sangho.Secret1

// Provision provisions and validates h as Caddy does (its Secrets
// default to Secret); the test's cleanup cleans it up.
func Provision(t testing.TB, h *sanghodedup.Handler) *sanghodedup.Handler {
	t.Helper()
	if h.Secrets == nil {
		h.Secrets = []string{Secret}
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() { _ = h.Cleanup() })
	if err := h.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	return h
}

// SignedRequest builds a request signed now with Secret, the way Sangho
// sends one (id, if not empty, in Sangho-Event-ID).
func SignedRequest(body, id string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhook", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if id != "" {
		r.Header.Set("Sangho-Event-ID", id)
	}
	r.Header.Set("Sangho-Signature", sangho.Sign(time.Now(), []byte(body), Secret))
	return r
}

// EventBody is a Sangho event with that ID.
func EventBody(id string) string {
	return `{"id":"` + id + `","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":2000}}}`
}

// Next is a next handler that answers 200 and counts its calls.
type Next struct{ Calls atomic.Int32 }

func (n *Next) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	n.Calls.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	w.WriteHeader(http.StatusOK)
	return nil
}

// Serve runs h like Caddy does: with a replacer in the context, and a
// HandlerError turned into its status.
func Serve(h *sanghodedup.Handler, r *http.Request, next caddyhttp.Handler) (*httptest.ResponseRecorder, *caddy.Replacer) {
	repl := caddy.NewReplacer()
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	w := httptest.NewRecorder()
	var he caddyhttp.HandlerError
	if err := h.ServeHTTP(w, r, next); errors.As(err, &he) {
		w.WriteHeader(he.StatusCode)
	}
	return w, repl
}

// Outcome is the delivery's {http.sangho_dedup.outcome}.
func Outcome(repl *caddy.Replacer) string {
	v, _ := repl.GetString("http.sangho_dedup.outcome")
	return v
}

// Adapt adapts a Caddyfile to JSON.
func Adapt(t testing.TB, src string) []byte {
	t.Helper()
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
	if err != nil {
		t.Fatalf("adapting: %v %v", err, warn)
	}
	return cfg
}

// Load runs a Caddyfile in this process, in a data directory of the
// test's own (a reload if Caddy runs); the test's cleanup stops Caddy.
func Load(t testing.TB, src string) error {
	t.Helper()
	cfg := Adapt(t, src)
	// Caddy's storage (its locks, last_clean.json) in the test's own
	// folder, not the user's; put back once Caddy has stopped.
	path := caddy.DefaultStorage.Path
	caddy.DefaultStorage.Path = t.TempDir()
	t.Cleanup(func() { caddy.DefaultStorage.Path = path })
	t.Cleanup(func() { _ = caddy.Stop() })
	return caddy.Load(cfg, true)
}

// Site is a Caddyfile of one site on 127.0.0.1:port, its admin endpoint
// on 127.0.0.1:adminPort (off if 0), logs discarded.
func Site(adminPort, port int, body string) string {
	admin := "off"
	if adminPort != 0 {
		admin = fmt.Sprintf("127.0.0.1:%d", adminPort)
	}
	return fmt.Sprintf(`{
	admin %s
	auto_https off
	persist_config off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
	bind 127.0.0.1
%s
}
`, admin, port, body)
}

// WaitFor polls cond until it holds, and fails the test if it does not
// within 10 s.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, what, cond)
}

// Client opens a connection per request: a config reload closes idle
// keep-alive connections.
var Client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Answer is what Caddy answered.
type Answer struct {
	Status int
	Dedup  string // the Sangho-Dedup header
	Body   map[string]any
}

// Do sends a request to a running Caddy (its body is read as JSON, if
// it is).
func Do(t testing.TB, method, url string, body string, header http.Header) Answer {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return Answer{resp.StatusCode, resp.Header.Get("Sangho-Dedup"), m}
}

// Send posts body to a running Caddy, signed now with Secret.
func Send(t testing.TB, url, body string) Answer {
	t.Helper()
	r := SignedRequest(body, "")
	return Do(t, http.MethodPost, url, body, r.Header)
}

// Target is a site's webhook URL and the secret it verifies.
type Target struct{ URL, Secret string }

// DeliverAll sends the event id with body to each target, signed with
// its secret as Sangho signs, and fails t unless each answers 200.
func DeliverAll(t testing.TB, client *http.Client, id, body string, targets ...Target) {
	t.Helper()
	for _, tg := range targets {
		status, _, _, err := load.Send(context.Background(), client, tg.URL, load.NewDelivery(id, []byte(body), tg.Secret))
		if err != nil {
			t.Fatal(err)
		}
		if status != 200 {
			t.Fatalf("delivery of %s to %s: %d", id, tg.URL, status)
		}
	}
}
