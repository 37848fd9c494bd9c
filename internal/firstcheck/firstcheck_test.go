package firstcheck

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A run passes: ok is set, and no later call runs the check again.
func TestEnsurePassesOnce(t *testing.T) {
	var f Flight
	var ok atomic.Bool
	runs := 0
	run := func(context.Context) (bool, error) { runs++; return false, nil }
	for range 3 {
		if err := f.Ensure(context.Background(), &ok, time.Hour, run); err != nil {
			t.Fatal(err)
		}
	}
	if !ok.Load() || runs != 1 {
		t.Fatalf("ok %v after %d runs, want true after 1", ok.Load(), runs)
	}
	ok.Store(false) // the caller saw a refusal: check again
	if err := f.Ensure(context.Background(), &ok, time.Hour, run); err != nil || runs != 2 {
		t.Fatalf("after the caller cleared ok: %v, %d runs, want a second run", err, runs)
	}
}

// Callers that come while a run is under way share its result.
func TestEnsureSharesTheRunUnderWay(t *testing.T) {
	var f Flight
	var ok atomic.Bool
	var runs atomic.Int64
	release := make(chan struct{})
	failed := errors.New("server down")
	run := func(context.Context) (bool, error) {
		runs.Add(1)
		<-release
		return false, failed
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- f.Ensure(context.Background(), &ok, time.Hour, run) })
	}
	for deadline := time.Now().Add(5 * time.Second); runs.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // the others reach the wait
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, failed) {
			t.Fatalf("a caller got %v, want the shared run's %v", err, failed)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs for 8 callers at once, want 1", n)
	}
}

// A refusal is remembered for retryEvery; any other failure is not.
func TestEnsureRemembersARefusalOnly(t *testing.T) {
	var f Flight
	var ok atomic.Bool
	runs := 0
	refused, down := errors.New("permission missing"), errors.New("server down")
	result := down
	run := func(context.Context) (bool, error) { runs++; return result == refused, result }
	for range 3 {
		if err := f.Ensure(context.Background(), &ok, time.Hour, run); err != down {
			t.Fatalf("got %v, want %v", err, down)
		}
	}
	if runs != 3 {
		t.Fatalf("%d runs for 3 calls after failures that are not refusals, want 3", runs)
	}
	result = refused
	for range 3 {
		if err := f.Ensure(context.Background(), &ok, time.Hour, run); err != refused {
			t.Fatalf("got %v, want %v", err, refused)
		}
	}
	if runs != 4 {
		t.Fatalf("%d runs, want 4: a refusal is remembered for retryEvery", runs)
	}
	result = nil
	if err := f.Ensure(context.Background(), &ok, 0, run); err != nil || runs != 5 || !ok.Load() {
		t.Fatalf("past retryEvery: %v after %d runs (ok %v), want a run that passes", err, runs, ok.Load())
	}
}

// A caller waiting for the run under way stops when its context is done.
func TestEnsureWaitEndsWithTheContext(t *testing.T) {
	var f Flight
	var ok atomic.Bool
	started, release := make(chan struct{}), make(chan struct{})
	go f.Ensure(context.Background(), &ok, time.Hour, func(context.Context) (bool, error) {
		close(started)
		<-release
		return false, nil
	})
	<-started
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := f.Ensure(ctx, &ok, time.Hour, func(context.Context) (bool, error) {
		t.Error("a second run while one is under way")
		return false, nil
	}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's deadline", err)
	}
}
