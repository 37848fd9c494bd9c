package main

import (
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sangho/caddy-sangho-dedup"
)

// The benchmark's config loads: Caddy adapts and provisions it (its
// Redis and PostgreSQL stores need no server for that). It stopped loading once the
// endpoint checks spanned every site of a config, and make bench
// failed with "two handlers are named ...": nothing had loaded it.
func TestBenchCaddyfileLoads(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	cfg := benchCaddyfile([6]int{18501, 18502, 18503, 18504, 18505, 18507}, "127.0.0.1:18500", 18506, "disable_pipeline",
		filepath.Join(t.TempDir(), "dedup.db"), "postgres://postgres@127.0.0.1:18508/postgres?sslmode=disable", "max_conns 16")
	json, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cfg)
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
