package redistest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// repoRoot is the directory of the module's go.mod, above the test's
// working directory (its package's directory).
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// DocsCommand returns the line of a code block that starts with prefix,
// in the README and the reference in docs/ (the README prints the Redis
// ACL line, docs/redis.md prints it again with its reasons): at least
// one such line, and every copy the same, so that none can drift from
// the one tested.
func DocsCommand(t testing.TB, prefix string) string {
	t.Helper()
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var found, where []string
	for _, file := range append([]string{filepath.Join(root, "README.md")}, files...) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		inCode := false
		for _, l := range strings.Split(string(data), "\n") {
			trimmed := strings.TrimSpace(l)
			if strings.HasPrefix(trimmed, "```") {
				inCode = !inCode
				continue
			}
			if inCode && strings.HasPrefix(trimmed, prefix) {
				found = append(found, trimmed)
				where = append(where, file)
			}
		}
	}
	if len(found) == 0 {
		t.Fatalf("README.md, docs/*.md: no `%s` line in a code block", prefix)
	}
	for i := range found {
		if found[i] != found[0] {
			t.Fatalf("the `%s` lines differ: %s has %q, %s has %q", prefix, where[0], found[0], where[i], found[i])
		}
	}
	return found[0]
}

// DocsACL returns the ACL command printed in the README and
// docs/redis.md (the line of a code block that starts with
// "redis-cli ACL SETUSER"), with the user name and password it sets.
func DocsACL(t testing.TB) (line, user, password string) {
	t.Helper()
	line = DocsCommand(t, "redis-cli ACL SETUSER ")
	f := strings.Fields(line)
	user = f[3]
	for _, a := range f[4:] {
		if a = strings.Trim(a, `'"`); strings.HasPrefix(a, ">") {
			password = a[1:]
		}
	}
	if password == "" {
		t.Fatalf("README ACL line %q sets no password", line)
	}
	return line, user, password
}

// ACLUser creates, on admin's server, the README's ACL user under the
// name user, without the permissions in drop (e.g. "+pexpire"), and
// with the key pattern keys instead of the README's when not empty.
func ACLUser(t testing.TB, admin *redis.Client, user, keys string, drop ...string) (password string) {
	t.Helper()
	line, _, password := DocsACL(t)
	f := strings.Fields(line)[4:] // after "redis-cli ACL SETUSER <user>"
	args := []any{"ACL", "SETUSER", user, "reset"}
	for _, a := range f {
		a = strings.Trim(a, `'"`)
		if slices.Contains(drop, a) {
			continue
		}
		if keys != "" && strings.HasPrefix(a, "~") {
			a = keys
		}
		args = append(args, a)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %v: %v", args, err)
	}
	return password
}
