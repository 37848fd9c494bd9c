package sanghodedup

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTestOnlyModulesStayOutOfTheBinary: the provider libraries used
// for test vectors are test dependencies only. `go list -deps` of
// ./cmd/caddy lists the modules compiled into the binary, which is what
// `go version -m` prints (.ci/run checks that too, on the built binary).
func TestTestOnlyModulesStayOutOfTheBinary(t *testing.T) {
	testOnly := []string{
		"github.com/stripe/stripe-go/v82",
		"github.com/standard-webhooks/standard-webhooks/libraries",
		"github.com/google/go-github/v84",
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", "./cmd/caddy").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/caddy: %v\n%s", err, out)
	}
	modules := map[string]bool{}
	for line := range strings.SplitSeq(string(out), "\n") {
		modules[line] = true
	}
	if !modules["github.com/sangho/caddy-sangho-dedup"] || !modules["github.com/caddyserver/caddy/v2"] {
		t.Fatalf("go list -deps does not list this module and Caddy: %s", out)
	}
	for _, m := range testOnly {
		if modules[m] {
			t.Errorf("%s, a test-only dependency, is compiled into ./cmd/caddy", m)
		}
	}
	// The same list, for the tests of ./providers (which sign and check
	// each provider's vectors with those libraries), must hold them: else
	// the check above proves nothing.
	out, err = exec.Command("go", "list", "-deps", "-test", "-f", "{{with .Module}}{{.Path}}{{end}}", "./providers").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps -test ./providers: %v\n%s", err, out)
	}
	for _, m := range testOnly {
		if !strings.Contains(string(out), m+"\n") {
			t.Errorf("%s is not a dependency of the tests of ./providers either: update this list", m)
		}
	}
}
