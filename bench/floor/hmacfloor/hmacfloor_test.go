package hmacfloor

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"
)

// The floor does the work it claims: a body signed with the secret
// reaches the next handler whole, re-readable after the floor read it;
// a bad signature, a missing one, and a body past max_body_size are
// answered (401, 401, 413) without the next handler.
func TestFloorVerifiesAndPassesTheBody(t *testing.T) {
	f := &Floor{Secret: "whsec_floor", MaxBodySize: 128 << 10}
	if err := f.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	body := `{"id":"evt_1","data":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}`
	now := time.Now()
	var got string
	var calls int
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		calls++
		b, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		if r.ContentLength != int64(len(b)) {
			t.Errorf("ContentLength %d, body %d bytes", r.ContentLength, len(b))
		}
		got = string(b)
		return r.Body.Close()
	})
	serve := func(body, sig string) (int, error) {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
		if sig != "" {
			r.Header.Set("Sangho-Signature", sig)
		}
		err := f.ServeHTTP(httptest.NewRecorder(), r, next)
		var he caddyhttp.HandlerError
		if errors.As(err, &he) {
			return he.StatusCode, err
		}
		return 0, err
	}

	if status, err := serve(body, sangho.Sign(now, []byte(body), "whsec_floor")); status != 0 || err != nil {
		t.Fatalf("a good signature: status %d, %v", status, err)
	}
	if calls != 1 || got != body {
		t.Fatalf("the next handler ran %d times and read %d of %d bytes", calls, len(got), len(body))
	}
	for name, sig := range map[string]string{
		"wrong secret": sangho.Sign(now, []byte(body), "whsec_other"),
		"other body":   sangho.Sign(now, []byte(body+" "), "whsec_floor"),
		"too old":      sangho.Sign(now.Add(-time.Hour), []byte(body), "whsec_floor"),
		"none":         "",
	} {
		if status, _ := serve(body, sig); status != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, status)
		}
	}
	big := body + strings.Repeat(" ", 128<<10)
	if status, _ := serve(big, sangho.Sign(now, []byte(big), "whsec_floor")); status != http.StatusRequestEntityTooLarge {
		t.Errorf("past max_body_size: status %d, want 413", status)
	}
	if calls != 1 {
		t.Errorf("the next handler ran %d times; only the good signature should reach it", calls)
	}
}
