// Package firstcheck runs a store's first-use check (the Redis user's
// permissions, the PostgreSQL table and its privileges) until it
// passes: one run at a time, the requests that come meanwhile sharing
// its result, and a refusal (something an operator must fix) remembered
// for a while, so that a broken setup costs the server one check per
// interval, not one per request. Any other failure (the server down) is
// not remembered: the next request runs the check again.
package firstcheck

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Flight is the check under way and the refusal remembered. The zero
// value is ready.
type Flight struct {
	mu      sync.Mutex
	running chan struct{} // closed when the run under way ends
	last    error         // its result
	refused error         // the last refusal
	at      time.Time     // when it was found
}

// Ensure returns nil once ok is set, and otherwise runs run to set it.
// ok is the caller's flag, read on its own fast path and cleared by it
// when the server starts refusing (a grant revoked): Ensure sets it when
// a run passes. A refusal found less than retryEvery ago is returned
// without a run; a run under way is waited for (until ctx is done) and
// its result returned. run reports whether its error is a refusal to
// remember.
func (f *Flight) Ensure(ctx context.Context, ok *atomic.Bool, retryEvery time.Duration, run func(context.Context) (refused bool, err error)) error {
	if ok.Load() {
		return nil
	}
	f.mu.Lock()
	if ok.Load() {
		f.mu.Unlock()
		return nil
	}
	if f.refused != nil && time.Since(f.at) < retryEvery {
		err := f.refused
		f.mu.Unlock()
		return err
	}
	if ch := f.running; ch != nil {
		// Share the run under way instead of starting another.
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.last
	}
	ch := make(chan struct{})
	f.running = ch
	f.mu.Unlock()

	refused, err := run(ctx)

	f.mu.Lock()
	f.running, f.last = nil, err
	switch {
	case err == nil:
		f.refused = nil
		ok.Store(true)
	case refused:
		f.refused, f.at = err, time.Now()
	}
	f.mu.Unlock()
	close(ch)
	return err
}
