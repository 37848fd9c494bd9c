package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sangho/caddy-sangho-dedup"
	_ "github.com/sangho/caddy-sangho-dedup/bench/floor/hmacfloor"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/load"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
)

// The benchmark's config loads: Caddy adapts and provisions it (its
// Redis and PostgreSQL stores need no server for that). It stopped loading once the
// endpoint checks spanned every site of a config, and make bench
// failed with "two handlers are named ...": nothing had loaded it.
func TestBenchCaddyfileLoads(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	cfg := benchCaddyfile([6]int{18501, 18502, 18503, 18504, 18505, 18507}, [2]int{18509, 18510}, "127.0.0.1:18500", 18506, "disable_pipeline",
		filepath.Join(t.TempDir(), "dedup.db"), "postgres://postgres@127.0.0.1:18508/postgres?sslmode=disable", "max_conns 16")
	json, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cfg)
	}
	if !strings.Contains(string(json), `"handler":"sangho_hmac_floor"`) {
		t.Errorf("no floor site in the config:\n%s", json)
	}
	if len(warnings) > 0 {
		t.Errorf("warnings: %v", warnings)
	}
	var c caddy.Config
	if err := caddy.StrictUnmarshalJSON(json, &c); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&c); err != nil {
		t.Fatalf("the benchmark's config does not load: %v", err)
	}
}

// --file-store points the file site at a store filled by -filescale
// fill: the path is taken (made absolute) when its store folder is
// there, the report names what the fill left in it, and a path with no
// store is refused before anything starts, naming the fill.
func TestFileStoreFlag(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "full", "dedup.db")
	if err := filestore.BenchFill(path, 2000, time.Now(), scaleHours, scaleRetention, nil); err != nil {
		t.Fatal(err)
	}
	// the fill left its live records, the expired ones deleted
	st, err := filestore.OpenForBench(path, time.Now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n, err := st.Entries()
	if cerr := st.BenchClose(); err == nil {
		err = cerr
	}
	if err != nil || n < 1998 || n > 2000 {
		t.Fatalf("the filled store holds %d records, %v; want the 2000 live ones", n, err)
	}
	got, err := checkFileStore(path)
	if err != nil || got != path {
		t.Fatalf("checkFileStore(%s) = %q, %v", path, got, err)
	}
	end, _, err := filestore.BenchFillEnd(path)
	if err != nil {
		t.Fatal(err)
	}
	// Just filled: nothing expired yet.
	if note := fileStoreNote(path, end); !strings.Contains(note, "2000 live records") || strings.Contains(note, "expired") {
		t.Errorf("note of the filled store at its end: %q", note)
	}
	// 36 minutes later, 36 min of the 72 h retention: 1/120 of the
	// 2000 records; 18 hours later, a quarter.
	for _, c := range []struct {
		after time.Duration
		want  string
	}{
		{36 * time.Minute, "36m0s before this run: about 16 of them (0.8 %) had expired"},
		{18 * time.Hour, "18h0m0s before this run: about 500 of them (25.0 %) had expired"},
	} {
		if note := fileStoreNote(path, end.Add(c.after)); !strings.Contains(note, c.want) {
			t.Errorf("note %v after the fill: %q, want %q in it", c.after, note, c.want)
		}
	}
	if cfg := benchCaddyfile([6]int{1, 2, 3, 4, 5, 6}, [2]int{}, "127.0.0.1:7", 8, "", got, "", ""); !strings.Contains(cfg, "store file "+path) {
		t.Errorf("the config does not use the store:\n%s", cfg)
	}
	if _, err := checkFileStore(filepath.Join(dir, "none", "dedup.db")); err == nil || !strings.Contains(err.Error(), "-filescale fill") {
		t.Errorf("a path without a store: %v", err)
	}
}

// A latency run's answers show the requests that fell due and were
// never sent (Caddy that far behind), beside the statuses.
func TestAnswersShowUnsent(t *testing.T) {
	got := answers(load.Result{ByStatus: map[string]int{"200": 3}, Unsent: 2})
	if got != "200×3 unsent×2" {
		t.Fatalf("answers: %q, want %q", got, "200×3 unsent×2")
	}
}
