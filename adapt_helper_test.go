package sanghodedup

import (
	"encoding/json"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// adaptCaddyfile adapts a Caddyfile to compact JSON.
func adaptCaddyfile(t testing.TB, src string) (string, []caddyconfig.Warning) {
	t.Helper()
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfg, warnings, err := adapter.Adapt([]byte(src), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	var v any
	if err := json.Unmarshal(cfg, &v); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(v)
	return string(out), warnings
}
