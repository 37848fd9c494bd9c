// Package mono is a monotonic clock in nanoseconds, immune to
// wall-clock steps, for the stores' local caches (how long since the
// connection that keeps a cache true last answered, when an entry
// expires).
package mono

import "time"

var base = time.Now()

// Now is the nanoseconds since the process loaded this package, read on
// the monotonic clock.
func Now() int64 { return int64(time.Since(base)) }
