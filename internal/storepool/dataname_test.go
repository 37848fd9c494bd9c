package storepool

import (
	"errors"
	"slices"
	"testing"
)

// TestDataName: a failed question stands for its load (asked once), the
// next load asks again, and the server's answer is then kept, with the
// fallback as its alias.
func TestDataName(t *testing.T) {
	var n DataName
	asked, failures := 0, 0
	answer := errors.New("down")
	ask := func() (string, error) {
		asked++
		if answer != nil {
			return "", answer
		}
		return "server", nil
	}
	failed := func(error) { failures++ }
	load1, load2, load3 := make(chan struct{}), make(chan struct{}), make(chan struct{})
	for range 2 {
		if id := n.Of(load1, "fallback", ask, failed); id != "fallback" {
			t.Fatalf("server down: %q", id)
		}
	}
	if asked != 1 || failures != 1 || n.Aliases() != nil {
		t.Fatalf("one load, server down: asked %d times, %d failures, aliases %q; want 1, 1, none", asked, failures, n.Aliases())
	}
	answer = nil
	if id := n.Of(load2, "fallback", ask, failed); id != "server" || asked != 2 {
		t.Fatalf("the next load, server up: %q, asked %d times; want server, 2", id, asked)
	}
	if id := n.Of(load3, "fallback", ask, failed); id != "server" || asked != 2 {
		t.Fatalf("a later load: %q, asked %d times; want the kept answer, 2", id, asked)
	}
	if al := n.Aliases(); !slices.Equal(al, []string{"fallback"}) {
		t.Fatalf("aliases %q, want the fallback", al)
	}
}
