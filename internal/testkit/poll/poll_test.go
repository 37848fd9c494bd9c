package poll

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// Until returns once the condition holds, after calling it again.
func TestUntilWaitsForTheCondition(t *testing.T) {
	var calls atomic.Int32
	Until(t, time.Second, "third call", func() bool { return calls.Add(1) >= 3 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}

// Until fails the test when the condition never holds in time.
func TestUntilFailsInTime(t *testing.T) {
	ft := &fatalT{TB: t}
	start := time.Now()
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine, as in a test
		defer close(done)
		Until(ft, 50*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if !ft.failed || time.Since(start) > 2*time.Second {
		t.Fatalf("failed %v after %v; want a failure after about 50 ms", ft.failed, time.Since(start))
	}
}

type fatalT struct {
	testing.TB
	failed bool
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(string, ...any) {
	f.failed = true
	runtime.Goexit()
}
