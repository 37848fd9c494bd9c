package sanghodedup

import (
	"io"
	"net/http"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// bodyProbe is a test-only handler (directive test_body_probe, used
// inside a route before sangho_dedup): it counts the requests whose body
// a later handler has started to read, so that a test knows, without
// timing, that sangho_dedup is waiting for body bytes.
type bodyProbe struct{}

// bodyReadsStarted counts the bodies read at least once since the test
// reset it.
var bodyReadsStarted atomic.Int64

func init() {
	caddy.RegisterModule(bodyProbe{})
	httpcaddyfile.RegisterHandlerDirective("test_body_probe", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return bodyProbe{}, nil
	})
}

func (bodyProbe) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_body_probe", New: func() caddy.Module { return new(bodyProbe) }}
}

func (bodyProbe) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Body != nil {
		r.Body = &probedBody{ReadCloser: r.Body}
	}
	return next.ServeHTTP(w, r)
}

type probedBody struct {
	io.ReadCloser
	started bool
}

func (b *probedBody) Read(p []byte) (int, error) {
	if !b.started {
		b.started = true
		bodyReadsStarted.Add(1)
	}
	return b.ReadCloser.Read(p)
}

// requestGate is a test-only handler (directive test_gate, inside a
// route before sangho_dedup): it holds every request until the test
// opens it, as a slow handler before sangho_dedup would (forward_auth,
// a rate limiter), so that a test can reload Caddy while a request has
// been read by the old config's server but has not reached sangho_dedup.
type requestGate struct{}

// gate is the test's handle on test_gate: arrived counts the requests
// held, open lets them through once closed.
var gate struct {
	arrived atomic.Int64
	open    atomic.Pointer[chan struct{}]
}

// closeGate makes test_gate hold the requests that come from now on,
// until openGate.
func closeGate() {
	ch := make(chan struct{})
	gate.arrived.Store(0)
	gate.open.Store(&ch)
}

// openGate lets the held requests go on, and those that come later.
func openGate() {
	if ch := gate.open.Swap(nil); ch != nil {
		close(*ch)
	}
}

func init() {
	caddy.RegisterModule(requestGate{})
	httpcaddyfile.RegisterHandlerDirective("test_gate", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return requestGate{}, nil
	})
}

func (requestGate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_gate", New: func() caddy.Module { return new(requestGate) }}
}

func (requestGate) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if ch := gate.open.Load(); ch != nil {
		gate.arrived.Add(1)
		<-*ch
	}
	return next.ServeHTTP(w, r)
}
