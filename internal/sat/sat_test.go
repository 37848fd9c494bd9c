package sat

import (
	"math"
	"testing"
	"time"
)

func TestAddSaturates(t *testing.T) {
	for _, c := range []struct{ a, b, want time.Duration }{
		{time.Second, time.Second, 2 * time.Second},
		{0, 0, 0},
		{math.MaxInt64, 0, math.MaxInt64},
		{math.MaxInt64, 1, math.MaxInt64},
		{math.MaxInt64 - 1, 1, math.MaxInt64},
		{math.MaxInt64 / 2, math.MaxInt64/2 + 2, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64},
	} {
		if got := Add(c.a, c.b); got != c.want {
			t.Errorf("Add(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
