package memstate

import (
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testclock"
)

func TestSweeper(t *testing.T) {
	clock := testclock.New()
	st := New(clock.Now, time.Hour)
	defer st.Destruct()
	st.Claim("a", "t", time.Second)
	st.Claim("b", "t", time.Hour)
	st.Commit("c", "t", "done:{}", 2*time.Second)
	if n := st.Len(); n != 3 {
		t.Fatalf("size = %d", n)
	}
	clock.Advance(3 * time.Second)
	if n := st.Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1 (the done record; the expired lease is a mark)", n)
	}
	if n := st.Len(); n != 2 {
		t.Fatalf("size after sweep = %d, want 2", n)
	}
	// Marks are swept once MarkFor is over: memory stays bounded.
	clock.Advance(dedup.MarkFor)
	if n := st.Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1 (the mark past MarkFor)", n)
	}
	if n := st.Len(); n != 1 {
		t.Fatalf("size after sweep = %d, want 1 (the live lease)", n)
	}
}

func TestSweeperRunsAndStops(t *testing.T) {
	st := New(time.Now, 10*time.Millisecond)
	st.Commit("a", "t", "done:{}", time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for st.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not remove an expired entry within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st.Destruct() // returns only once the sweeper goroutine has exited
	select {
	case <-st.done:
	default:
		t.Fatal("sweeper still running after Destruct")
	}
}
