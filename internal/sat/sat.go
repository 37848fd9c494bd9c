// Package sat adds durations without overflow: a sum past the largest
// time.Duration is that largest one (about 292 years), never a negative
// duration that would make a deadline already past.
package sat

import (
	"math"
	"time"
)

// Add returns a+b, or math.MaxInt64 where that overflows. a and b are
// not negative.
func Add(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
