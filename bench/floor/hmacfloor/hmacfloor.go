// Package hmacfloor is a benchmark's floor, never part of the plugin:
// a Caddy handler that does only what any handler in front of a webhook
// backend has to do with a body that sangho_dedup handles, buffering it
// (at most max_body_size bytes, from a pool, as sangho_dedup does) and
// checking its Sangho signature with the sangho provider's own check,
// then passing the request on with the buffered body. No event ID, no
// fingerprint, no store. sangho-bench measures it beside sangho_dedup
// (target hmacfloor, --floor-caddy): the Caddy that has it is built
// from ./bench/floor/hmacfloor/caddy, never from ./cmd/caddy.
package hmacfloor

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/providers"
)

func init() {
	caddy.RegisterModule(Floor{})
	httpcaddyfile.RegisterHandlerDirective("sangho_hmac_floor", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		f := new(Floor)
		return f, f.UnmarshalCaddyfile(h.Dispenser)
	})
	// where sangho_dedup runs: before handle, respond, reverse_proxy
	httpcaddyfile.RegisterDirectiveOrder("sangho_hmac_floor", httpcaddyfile.After, "forward_auth")
}

// DefaultMaxBodySize is sangho_dedup's default max_body_size.
const DefaultMaxBodySize = 1 << 20

// Floor is http.handlers.sangho_hmac_floor. Caddyfile:
//
//	sangho_hmac_floor {
//		secret <secret>        # required
//		max_body_size <size>   # default 1MiB
//	}
//
// It answers 413 past max_body_size, 400 when the body cannot be read,
// 401 when the signature does not verify (as sangho_dedup does), and
// otherwise calls the next handler.
type Floor struct {
	Secret      string `json:"secret"`
	MaxBodySize int64  `json:"max_body_size,omitempty"`

	verifier providers.Sangho
}

// CaddyModule returns the Caddy module information.
func (Floor) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sangho_hmac_floor",
		New: func() caddy.Module { return new(Floor) },
	}
}

// Provision sets up the sangho provider's check with its defaults.
func (f *Floor) Provision(caddy.Context) error {
	if f.Secret == "" {
		return errors.New("sangho_hmac_floor: secret is required")
	}
	if f.MaxBodySize <= 0 {
		f.MaxBodySize = DefaultMaxBodySize
	}
	d := f.verifier.Defaults()
	return f.verifier.Init(dedup.ProviderConfig{
		Secrets:         []string{f.Secret},
		SignatureHeader: d.SignatureHeader,
		EventIDHeaders:  d.EventIDHeaders,
		Tolerance:       d.Tolerance,
		Now:             time.Now,
	})
}

// UnmarshalCaddyfile reads the block shown on Floor.
func (f *Floor) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	for d.NextBlock(0) {
		opt := d.Val()
		if !d.NextArg() {
			return d.ArgErr()
		}
		switch opt {
		case "secret":
			f.Secret = d.Val()
		case "max_body_size":
			n, err := humanize.ParseBytes(d.Val())
			if err != nil || n == 0 || n > 64<<20 {
				return d.Errf("max_body_size: invalid size %q (e.g. 512KB, 1MiB, at most 64MiB)", d.Val())
			}
			f.MaxBodySize = int64(n)
		default:
			return d.Errf("sangho_hmac_floor: unknown option %q", opt)
		}
	}
	return nil
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// ServeHTTP buffers, verifies, and passes the request on.
func (f *Floor) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.ContentLength > f.MaxBodySize {
		return caddyhttp.Error(http.StatusRequestEntityTooLarge, errors.New("body larger than max_body_size"))
	}
	buf := bufPool.Get().(*bytes.Buffer)
	var err error
	if r.Body != nil {
		_, err = buf.ReadFrom(io.LimitReader(r.Body, f.MaxBodySize+1))
		_ = r.Body.Close()
	}
	if err == nil && int64(buf.Len()) > f.MaxBodySize {
		err = caddyhttp.Error(http.StatusRequestEntityTooLarge, errors.New("body larger than max_body_size"))
	}
	if err != nil {
		recycle(buf)
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			return err
		}
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if _, err := f.verifier.Verify(r, buf.Bytes()); err != nil {
		recycle(buf)
		return caddyhttp.Error(http.StatusUnauthorized, err)
	}
	b := &body{buf: buf}
	b.rd.Reset(buf.Bytes())
	r.Body, r.ContentLength, r.TransferEncoding, r.GetBody = b, int64(buf.Len()), nil, nil
	// The buffer goes back to the pool when the handler chain is done, as
	// sangho_dedup's does, also when nothing read the body (respond): a
	// floor that allocated a new buffer per request would be no floor.
	defer b.Close()
	return next.ServeHTTP(w, r)
}

// body is the buffered body; its buffer goes back to the pool when the
// reader closes it (a body nobody closes is left to the collector).
type body struct {
	mu   sync.Mutex
	buf  *bytes.Buffer
	rd   bytes.Reader
	shut bool
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shut {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.rd.Read(p)
}

func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.shut {
		b.shut = true
		recycle(b.buf)
	}
	return nil
}

func recycle(buf *bytes.Buffer) {
	if buf.Cap() <= 2<<20 {
		buf.Reset()
		bufPool.Put(buf)
	}
}

var (
	_ caddy.Provisioner           = (*Floor)(nil)
	_ caddyhttp.MiddlewareHandler = (*Floor)(nil)
	_ caddyfile.Unmarshaler       = (*Floor)(nil)
)
