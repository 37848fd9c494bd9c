package sanghodedup

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestBackendGetsTheExactBytes(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	var got []byte
	var gotLen int64
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		got, _ = io.ReadAll(r.Body)
		gotLen = r.ContentLength
		return nil
	})
	body := "  \n" + bodyB + "\n" // whitespace, UTF-8 and all
	r := signedRequest(body, "")
	r.ContentLength = -1 // arrived chunked
	if w, _, err := serve(h, r, next); err != nil || w.Code != 200 {
		t.Fatalf("%d %v", w.Code, err)
	}
	if string(got) != body || gotLen != int64(len(body)) {
		t.Fatalf("backend got %q (length %d), want %q", got, gotLen, body)
	}
}

// TestBodyReadAfterCloseFails: a next handler that reads part of the
// body, closes it and fails (a backend that went away mid-upload) lets
// the buffer go back to the pool. Whoever reads r.Body after that (e.g.
// handle_errors { reverse_proxy ... }) must get http.ErrBodyReadAfterClose,
// never the rest of the buffer, which may already hold another request.
func TestBodyReadAfterCloseFails(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	first := `{"id":"evt_first","pad":"` + strings.Repeat("a", 4000) + `"}`
	second := `{"id":"evt_second","pad":"` + strings.Repeat("B", 4000) + `"}`
	var kept io.ReadCloser
	partial := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		kept = r.Body
		if _, err := io.ReadFull(r.Body, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return caddyhttp.Error(http.StatusBadGateway, errors.New("upstream went away mid-upload"))
	})
	if _, _, err := serve(h, signedRequest(first, ""), partial); err == nil {
		t.Fatal("the failing next handler's error was lost")
	}
	// Another request now takes a buffer from the pool, likely the same.
	if w, _, err := serve(h, signedRequest(second, ""), &countingNext{}); err != nil || w.Code != 200 {
		t.Fatalf("second request: %d %v", w.Code, err)
	}
	got := make([]byte, 8192)
	n, err := kept.Read(got)
	if n != 0 || !errors.Is(err, http.ErrBodyReadAfterClose) {
		t.Fatalf("read after close: %d bytes (another request's: %v), %v; want 0 and http.ErrBodyReadAfterClose",
			n, bytes.Contains(got[:n], []byte("BBBB")), err)
	}

	// And while the handler still holds the buffer: closed is closed.
	var n2 int
	var err2 error
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		r.Body.Close()
		n2, err2 = r.Body.Read(make([]byte, 10))
		return nil
	})
	serve(h, signedRequest(eventBody("evt_closed_early"), ""), next)
	if n2 != 0 || !errors.Is(err2, http.ErrBodyReadAfterClose) {
		t.Fatalf("read after close, handler running: %d bytes, %v", n2, err2)
	}
}

// TestClientTrailersNotPassedOn: a chunked delivery's trailers went on
// with the request (reverse_proxy forwards request trailers, and sends
// the body chunked again to carry them): a client's
// Sangho-Dedup-Prior-Attempt among them, past the header's removal, and
// no Content-Length for the backend. The body is read whole, so they are
// dropped, and the backend gets the body with its length.
func TestClientTrailersNotPassedOn(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	var trailer http.Header
	var te []string
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, _ = io.ReadAll(r.Body)
		trailer, te = r.Trailer, r.TransferEncoding
		return nil
	})
	r := signedRequest(bodyB, "")
	r.ContentLength = -1 // arrived chunked, with a trailer
	r.TransferEncoding = []string{"chunked"}
	r.Trailer = http.Header{"Sangho-Dedup-Prior-Attempt": {"unknown"}, "X-Other": {"1"}}
	if w, _, err := serve(h, r, next); err != nil || w.Code != 200 {
		t.Fatalf("%d %v", w.Code, err)
	}
	if trailer != nil || te != nil {
		t.Fatalf("the next handler got trailers %v, transfer encoding %v; want none", trailer, te)
	}
}
