// Package testclock is a clock the tests set by hand.
package testclock

import (
	"sync"
	"time"
)

// Clock is a swappable clock for time-dependent logic; it starts at the
// known-answer vectors' time, 2024-12-02 12:00:00 UTC.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a Clock at 1733140800 (Unix seconds).
func New() *Clock { return &Clock{t: time.Unix(1733140800, 0)} }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
