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
