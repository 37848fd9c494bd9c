package sanghodedup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"

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

// TestBodyAtTheLimitIsAccepted: a body of exactly max_body_size bytes is
// a valid delivery, declared or chunked; one byte more is 413.
func TestBodyAtTheLimitIsAccepted(t *testing.T) {
	const limit = 1024
	h, _ := newTestHandler(t, func(h *Handler) { h.MaxBodySize = limit })
	for _, chunked := range []bool{false, true} {
		for _, extra := range []int{0, 1} {
			head := fmt.Sprintf(`{"id":"evt_at_limit_%v_%d","pad":"`, chunked, extra)
			body := head + strings.Repeat("x", limit-len(head)-2+extra) + `"}`
			r := signedRequest(body, "")
			if chunked {
				r.ContentLength = -1
			}
			next := &countingNext{}
			w, _, err := serve(h, r, next)
			want := http.StatusOK
			if extra > 0 {
				want = http.StatusRequestEntityTooLarge
			}
			if w.Code != want {
				t.Errorf("%d bytes (chunked %v): %d %v, want %d", len(body), chunked, w.Code, err, want)
			}
			if want == http.StatusOK && (len(next.bodies) != 1 || next.bodies[0] != body) {
				t.Errorf("%d bytes (chunked %v): the backend got %d bodies", len(body), chunked, len(next.bodies))
			}
		}
	}
}

// TestDeclaredTooLargeIsRefusedUnread: a Content-Length over
// max_body_size is 413 before a byte of the body is read (no 100
// Continue, no memory); and a body cut short by an outer
// http.MaxBytesReader (Caddy's request_body max_size) is 413 too, not 400.
func TestDeclaredTooLargeIsRefusedUnread(t *testing.T) {
	h, _ := newTestHandler(t, func(h *Handler) { h.MaxBodySize = 1024 })
	r := signedRequest(eventBody("evt_declared_big"), "")
	r.ContentLength = 1025
	r.Body = readFails{t}
	if w, _, _ := serve(h, r, &countingNext{}); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("declared 1025 bytes: %d, want 413", w.Code)
	}

	r = signedRequest(eventBody("evt_outer_limit"), "")
	r.ContentLength = -1
	r.Body = http.MaxBytesReader(nil, r.Body, 10)
	if w, _, err := serve(h, r, &countingNext{}); w.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("outer MaxBytesReader: %d %v, want 413", w.Code, err)
	}

	r = signedRequest(eventBody("evt_read_error"), "")
	r.ContentLength = -1
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader(`{"id":"evt_read_error"`), iotest.ErrReader(errors.New("connection reset"))))
	if w, _, err := serve(h, r, &countingNext{}); w.Code != http.StatusBadRequest {
		t.Errorf("read error: %d %v, want 400", w.Code, err)
	}
}

type readFails struct{ t *testing.T }

func (b readFails) Read([]byte) (int, error) {
	if b.t != nil {
		b.t.Error("the body of a request declared too large was read")
	}
	return 0, errors.New("read")
}
func (readFails) Close() error { return nil }

// TestBodyReadAfterTheHandlerReturnedIsItsOwn: whoever reads r.Body
// after ServeHTTP returned without closing it first (reverse_proxy's
// transport may still be sending it) reads this request's bytes, never
// those of a later request that took the buffer from the pool.
func TestBodyReadAfterTheHandlerReturnedIsItsOwn(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	for i := range 5 {
		first := fmt.Sprintf(`{"id":"evt_late_reader_%d","pad":"%s"}`, i, strings.Repeat("a", 4000))
		second := fmt.Sprintf(`{"id":"evt_late_other_%d","pad":"%s"}`, i, strings.Repeat("B", 4000))
		var kept io.ReadCloser
		late := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			kept = r.Body // read after the handler returned
			w.WriteHeader(http.StatusOK)
			return nil
		})
		if w, _, err := serve(h, signedRequest(first, ""), late); err != nil || w.Code != 200 {
			t.Fatalf("first: %d %v", w.Code, err)
		}
		if w, _, err := serve(h, signedRequest(second, ""), &countingNext{}); err != nil || w.Code != 200 {
			t.Fatalf("second: %d %v", w.Code, err)
		}
		got, err := io.ReadAll(kept)
		kept.Close()
		if err != nil || string(got) != first {
			t.Fatalf("late read: %v, another request's bytes: %v", err, strings.Contains(string(got), "BBBB"))
		}
	}
}

// TestPooledBodyRecycledOnlyWhenBothAreDone: the buffer goes back to the
// pool only once the handler is done and the reader closed the body,
// whichever comes last, however often the reader closes it; until then
// it holds the request's bytes.
func TestPooledBodyRecycledOnlyWhenBothAreDone(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	for _, handlerFirst := range []bool{false, true} {
		r := signedRequest(bodyA, "")
		b, _, err := h.readBody(r)
		if err != nil {
			t.Fatal(err)
		}
		if handlerFirst {
			b.done()
			got, err := io.ReadAll(r.Body) // a transport still sending it
			if err != nil || string(got) != bodyA {
				t.Fatalf("read after the handler is done: %q %v", got, err)
			}
		}
		r.Body.Close()
		r.Body.Close() // idempotent
		if !handlerFirst {
			if string(b.bytes()) != bodyA {
				t.Fatalf("the reader's Close (twice) recycled the buffer the handler still holds: %q", b.bytes())
			}
			b.done()
		}
	}
}
