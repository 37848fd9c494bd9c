package sanghodedup

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestReloadToOtherDataWarns: a reload that gives an endpoint (its
// secrets) other data, another store or key_prefix, starts from what
// that holds: the events processed before are unknown there and their
// redeliveries are processed again. Documented, and now said at load
// (found by the configuration review: a reload adding key_prefix, then
// another file, let one event be processed three times, no word).
func TestReloadToOtherDataWarns(t *testing.T) {
	ownDataDir(t)
	s := &caddyServer{port: freePort(t), logFile: filepath.Join(t.TempDir(), "caddy.log")}
	s.url = "http://127.0.0.1:" + strconv.Itoa(s.port) + "/webhook"
	t.Cleanup(func() { _ = caddy.Stop() })
	// A secret of its own: handlers that other tests of the package left
	// registered do not count as the config before.
	site := func(extra string) string {
		return "\tsangho_dedup {\n\t\tsecret whsec_moved_test_only\n\t\tstore memory\n" + extra + "\t}\n\trespond 200\n"
	}
	moved := func() int {
		entries, _ := logEntries(t, s.logFile)
		n := 0
		for _, e := range entries {
			if e["msg"] == "endpoint moved to other data" && e["level"] == "warn" && e["was"] != nil && e["now"] != nil {
				n++
			}
		}
		return n
	}
	for i, c := range []struct {
		extra string
		warns int // in all, so far
	}{
		{"", 0},
		{"\t\tretention 96h\n", 0},                // the same data
		{"\t\tkey_prefix shop:\n", 1},             // another key_prefix: another name too
		{"\t\tkey_prefix shop:\n\t\tname s\n", 1}, // renamed only
		{"\t\tkey_prefix other:\n\t\tname s\n", 2},
	} {
		s.load(t, site(c.extra))
		if got := moved(); got != c.warns {
			_, text := logEntries(t, s.logFile)
			t.Fatalf("load %d (%q): %d warnings in all, want %d; log:\n%s", i+1, c.extra, got, c.warns, text)
		}
	}
}

// TestAddingAnEndpointIsNoMove: a reload that adds a second endpoint with
// the same secret and a key_prefix of its own (what "endpoints share
// their event IDs" advises, a Shopify app's second subscription) moves
// nothing, and does not warn "endpoint moved to other data" (found by
// the review of that warning: it did).
func TestAddingAnEndpointIsNoMove(t *testing.T) {
	ownDataDir(t)
	s := &caddyServer{port: freePort(t), logFile: filepath.Join(t.TempDir(), "caddy.log")}
	s.url = "http://127.0.0.1:" + strconv.Itoa(s.port) + "/webhook"
	t.Cleanup(func() { _ = caddy.Stop() })
	block := func(path, extra string) string {
		return "\thandle " + path + " {\n\t\tsangho_dedup {\n\t\t\tprovider shopify\n\t\t\tsecret whsec_review_moved_only\n\t\t\tstore memory\n" + extra + "\t\t}\n\t\trespond 200\n\t}\n"
	}
	s.load(t, block("/orders", ""))
	s.load(t, block("/orders", "")+block("/inventory", "\t\t\tkey_prefix inventory:\n"))
	entries, text := logEntries(t, s.logFile)
	for _, e := range entries {
		if e["msg"] == "endpoint moved to other data" {
			t.Errorf("warned of a move though /orders kept its data: %v\n%s", e, text)
		}
	}
}

// TestRemovingAnEndpointIsNoMove: a reload that drops one of two
// endpoints with one secret (its own key_prefix) moves nothing: the one
// left keeps its data (found by the last review: it warned that the
// dropped one's data moved to the one left's).
func TestRemovingAnEndpointIsNoMove(t *testing.T) {
	block := func(path, extra string) string {
		return "\thandle " + path + " {\n\t\tsangho_dedup {\n\t\t\tprovider shopify\n\t\t\tsecret whsec_review_removed_only\n\t\t\tstore memory\n" + extra + "\t\t}\n\t\trespond 200\n\t}\n"
	}
	s := startCaddyLogging(t, block("/orders", "")+block("/inventory", "\t\t\tkey_prefix inventory:\n"))
	s.load(t, block("/orders", ""))
	entries, text := logEntries(t, s.logFile)
	for _, e := range entries {
		if e["msg"] == "endpoint moved to other data" {
			t.Errorf("warned of a move though /orders kept its data and /inventory is gone: %v\n%s", e, text)
		}
	}
}
