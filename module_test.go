package sanghodedup

import (
	"fmt"
	"os"
	"testing"
)

// TestMain keeps the tests away from the user's Caddy data directory:
// the default (file) store lives there. It also runs the helper
// processes of the file store's tests (see fileHelperMain).
func TestMain(m *testing.M) {
	if os.Getenv(fileHelperEnv) != "" {
		os.Exit(fileHelperMain())
	}
	dir, err := os.MkdirTemp("", "sangho-dedup-test-data-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
