// Package poll waits in tests for a condition that another goroutine or
// process brings about: a bound on a liveness wait on a loaded machine,
// never a timing claim.
package poll

import (
	"testing"
	"time"
)

// Until calls cond every 5 ms until it holds, and fails the test if it
// does not within the given time.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
	}
}
