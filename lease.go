package sanghodedup

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// lease is a delivery's claim on its event, renewed every lock_ttl/3
// while the next handler runs. No goroutine is started: a timer fires
// only for events still in flight after lock_ttl/3.
type lease struct {
	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
	expires time.Time // when the lease ends in the store, as far as we know
}

func (l *lease) expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// startLease starts renewing d's lease, which runs from the claim.
func (d *delivery) startLease() {
	l := &d.lease
	l.mu.Lock()
	l.expires = d.claimed.Add(time.Duration(d.h.LockTTL))
	l.timer = time.AfterFunc(d.h.renewEvery, d.renew)
	l.mu.Unlock()
}

// renew extends d's lease and sets the timer for the next renewal,
// unless the lease was stopped or lost.
func (d *delivery) renew() {
	h, l := d.h, &d.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	ctx, cancel := context.WithTimeout(d.ctx, h.renewEvery)
	defer cancel()
	start := time.Now()
	ok, err := h.store.Renew(ctx, d.key, d.token, time.Duration(h.LockTTL))
	observe(opRenew, start, err)
	if ok {
		l.expires = start.Add(time.Duration(h.LockTTL))
	}
	switch {
	case err != nil:
		h.logger.Warn("renewal failed", zap.String("event_id", d.id), zap.Error(err))
	case !ok:
		metrics.leaseLost.Inc()
		h.logger.Warn("lease lost", zap.String("event_id", d.id), zap.String("during", "renewal"))
		return
	}
	l.timer.Reset(nextRenewal(h.renewEvery, err != nil, time.Until(l.expires)))
}

// minRenewRetry is the least wait before a failed renewal is tried again.
const minRenewRetry = 10 * time.Millisecond

// nextRenewal is the wait before the next renewal: every lock_ttl/3, but
// after a failed one at half the time the lease has left, if sooner: a
// renewal that failed after waiting its whole timeout ends at two thirds
// of the lease, and the next one, lock_ttl/3 later, would come as the
// lease runs out, which the store refuses.
func nextRenewal(every time.Duration, failed bool, left time.Duration) time.Duration {
	if failed && left > 0 && left/2 < every {
		return max(left/2, minRenewRetry)
	}
	return every
}

// stop ends renewals and waits for one under way to finish, so that no
// renewal runs after the commit or release.
func (l *lease) stop() {
	l.timer.Stop()
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
}
