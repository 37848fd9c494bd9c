package sanghodedup

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

var errTooLarge = errors.New("request body larger than max_body_size")

// Request bodies are read into pooled buffers. A buffer goes back to
// the pool only when both the handler is done and whoever read the body
// (reverse_proxy's transport, possibly after ServeHTTP returned) has
// closed it; a body nobody closes is left to the garbage collector.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledBuffer is the largest buffer kept for reuse.
const maxPooledBuffer = 2 << 20

type pooledBody struct {
	buf  *bytes.Buffer
	refs atomic.Int32

	mu   sync.Mutex // orders Read and Close: no Read runs once the buffer may be recycled
	rd   bytes.Reader
	shut bool

	read atomic.Bool // Read was called: a next handler began to send the body on
}

func (b *pooledBody) bytes() []byte { return b.buf.Bytes() }

// Read reads the body; after Close it fails with
// http.ErrBodyReadAfterClose, as net/http's own request bodies do: the
// buffer may already be back in the pool and hold another request (a
// later reader, e.g. reverse_proxy in handle_errors after a backend that
// read part of the body and failed).
func (b *pooledBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shut {
		return 0, http.ErrBodyReadAfterClose
	}
	return b.rd.Read(p)
}

// Close is called by the reader of the body; idempotent.
func (b *pooledBody) Close() error {
	b.mu.Lock()
	first := !b.shut
	b.shut = true
	b.mu.Unlock()
	if first {
		b.unref()
	}
	return nil
}

// done is called by the handler when it is finished with the body.
func (b *pooledBody) done() { b.unref() }

func (b *pooledBody) unref() {
	if b.refs.Add(-1) == 0 {
		recycle(b.buf)
	}
}

// recycle puts buf back into the pool unless it grew too large.
func recycle(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledBuffer {
		buf.Reset()
		bufPool.Put(buf)
	}
}

// readBody reads the whole body, at most max_body_size bytes, and
// replaces r.Body with a re-readable copy for the next handler. It
// returns the status to answer when it fails: 413 past the limit
// (declared or counted, chunked too), 400 when the body cannot be read
// (truncated, client gone).
func (h *Handler) readBody(r *http.Request) (*pooledBody, int, error) {
	limit := h.MaxBodySize
	if r.ContentLength > limit {
		return nil, http.StatusRequestEntityTooLarge, errTooLarge
	}
	// The buffer grows with the bytes that arrive (bytes.Buffer.ReadFrom
	// at most doubles it), never with Content-Length: a declared length
	// costs nothing until the body is sent, so connections that announce
	// large bodies and send none hold no memory for them. A pooled buffer
	// keeps its capacity from earlier requests.
	buf := bufPool.Get().(*bytes.Buffer)
	var err error
	if r.Body != nil {
		_, err = buf.ReadFrom(io.LimitReader(r.Body, limit+1))
		_ = r.Body.Close()
	}
	if err == nil && int64(buf.Len()) > limit {
		err = errTooLarge
	}
	if err != nil {
		recycle(buf)
		var mbe *http.MaxBytesError
		if errors.Is(err, errTooLarge) || errors.As(err, &mbe) {
			return nil, http.StatusRequestEntityTooLarge, errTooLarge
		}
		return nil, http.StatusBadRequest, errors.New("reading request body: " + err.Error())
	}
	b := &pooledBody{buf: buf}
	b.rd.Reset(buf.Bytes())
	b.refs.Store(2)
	r.Body = b
	r.ContentLength = int64(buf.Len())
	r.TransferEncoding = nil
	// A chunked request's trailers, read with the body, are not passed
	// on: reverse_proxy would send the body chunked again to carry them
	// (no Content-Length), and a client's Sangho-Dedup-Prior-Attempt
	// would reach the backend as one.
	r.Trailer = nil
	r.GetBody = nil
	return b, 0, nil
}
