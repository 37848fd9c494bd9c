package sanghodedup

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// The tests of facts that the docs repeat from the code: the stores that
// are registered, the log lines that are written, and the limits of the
// promise. Each derives the fact from the code (or states it once) and
// reads every place in the docs that repeats it.

// readRepoDoc returns a Markdown file of the repository.
func readRepoDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// registeredStores are the names of the store modules Caddy knows
// (http.sangho_dedup.stores.*), as the Caddyfile, the admin API and the
// spans name them.
func registeredStores(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, m := range caddy.GetModules("http.sangho_dedup.stores") {
		names = append(names, m.ID.Name())
	}
	sort.Strings(names)
	if len(names) < 4 {
		t.Fatalf("only %v registered in http.sangho_dedup.stores", names)
	}
	return names
}

// TestDocsListEveryStore: every place of the docs that lists the stores
// lists every registered store module: the table of docs/stores.md, the
// stores the admin API answers for and its "store" values
// (docs/operations.md), the sangho_dedup.store values of the spans
// (docs/observability.md), and the README's directive block and store
// option.
func TestDocsListEveryStore(t *testing.T) {
	stores := registeredStores(t)
	type place struct {
		file, what string
		list       func(doc string) string // the text that must name every store
		named      func(list, store string) bool
	}
	backticked := func(list, store string) bool { return strings.Contains(list, "`"+store+"`") }
	// prose names a store as a word: Redis, PostgreSQL.
	prose := func(list, store string) bool { return strings.Contains(strings.ToLower(list), store) }
	cut := func(re string) func(doc string) string {
		rx := regexp.MustCompile(re)
		return func(doc string) string {
			m := rx.FindStringSubmatch(doc)
			if m == nil {
				return ""
			}
			return m[1]
		}
	}
	places := []place{
		{"docs/stores.md", "the table's first column", func(doc string) string {
			var firsts []string
			for _, l := range strings.Split(doc, "\n") {
				if cells := strings.Split(l, "|"); len(cells) > 3 && strings.HasPrefix(l, "| `") {
					firsts = append(firsts, cells[1])
				}
			}
			return strings.Join(firsts, "\n")
		}, backticked},
		{"docs/operations.md", `"answered on every store (...)"`, cut(`answered on every store \(([^)]*)\)`), prose},
		{"docs/operations.md", `the admin API's "store" values`, cut(`"store":"([^"]*)"`), func(list, store string) bool {
			for _, v := range strings.Split(strings.ReplaceAll(list, `\|`, "|"), "|") {
				if v == store {
					return true
				}
			}
			return false
		}},
		{"docs/observability.md", "the sangho_dedup.store values of the spans", cut("`sangho_dedup.store` \\(([^)]*)\\)"), backticked},
		{"README.md", "the directive block's store line", cut("(?m)^\tstore (.*)$"), func(list, store string) bool {
			return regexp.MustCompile(`(^|\| )` + store + `\b`).MatchString(list)
		}},
		{"README.md", "the store option's row", cut("(?m)^\\| `store` \\|(.*)$"), backticked},
	}
	for _, p := range places {
		list := p.list(readRepoDoc(t, p.file))
		if list == "" {
			t.Errorf("%s: %s not found: has its wording changed? (this test reads it)", p.file, p.what)
			continue
		}
		for _, s := range stores {
			if !p.named(list, s) {
				t.Errorf("%s: %s (%q) does not name the store %s (registered: %v)", p.file, p.what, list, s, stores)
			}
		}
	}
}

// logLine is a message the code logs, at a level.
type logLine struct{ level, msg string }

// codeLogLines finds the log lines of the plugin's code (not tests, not
// cmd/, bench/, reliability/ or the test helpers): calls of Debug, Info,
// Warn and Error on a logger with a literal message, logger.Check with a
// zapcore level, and the handler's debug helper.
func codeLogLines(t *testing.T) map[logLine][]string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.go", "stores/*/*.go", "providers/*.go", "dedup/*.go", "internal/storepool/*.go", "internal/memtable/*.go", "internal/cfargs/*.go", "internal/promreg/*.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	levels := map[string]string{"Debug": "debug", "Info": "info", "Warn": "warn", "Error": "error",
		"DebugLevel": "debug", "InfoLevel": "info", "WarnLevel": "warn", "ErrorLevel": "error"}
	// A logger is a variable or field whose name says so (logger,
	// h.logger, d.h.logger), or a call of a Logger method
	// (ctx.Logger()).
	isLogger := func(e ast.Expr) bool {
		if call, ok := e.(*ast.CallExpr); ok {
			e = call.Fun
		}
		switch x := e.(type) {
		case *ast.Ident:
			return strings.Contains(strings.ToLower(x.Name), "logger")
		case *ast.SelectorExpr:
			return strings.Contains(strings.ToLower(x.Sel.Name), "logger")
		}
		return false
	}
	found := map[logLine][]string{}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			level, msgArg := "", ast.Expr(nil)
			switch {
			case levels[sel.Sel.Name] != "" && isLogger(sel.X):
				level, msgArg = levels[sel.Sel.Name], call.Args[0]
			case sel.Sel.Name == "Check" && isLogger(sel.X) && len(call.Args) == 2:
				if lv, ok := call.Args[0].(*ast.SelectorExpr); ok {
					level, msgArg = levels[lv.Sel.Name], call.Args[1]
				}
			case sel.Sel.Name == "debug" && len(call.Args) == 3: // (*Handler).debug(msg, id, typ)
				level, msgArg = "debug", call.Args[0]
			default:
				return true
			}
			lit, ok := msgArg.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || level == "" {
				return true // a message passed on (the debug helper's own Check)
			}
			msg, _ := strconv.Unquote(lit.Value)
			k := logLine{level, msg}
			found[k] = append(found[k], fset.Position(call.Pos()).String())
			return true
		})
	}
	return found
}

// docLogLines reads the tables of the Logs section of
// docs/observability.md: rows "| level | `message` | ...".
func docLogLines(t *testing.T) map[logLine]bool {
	t.Helper()
	logs := docSection(t, "docs/observability.md", "## Logs")
	row := regexp.MustCompile("(?m)^\\| (debug|info|warn|error)(?: \\([^|]*\\))? \\| `([^`]+)` \\|")
	got := map[logLine]bool{}
	for _, m := range row.FindAllStringSubmatch(logs, -1) {
		got[logLine{m[1], m[2]}] = true
	}
	return got
}

// TestDocsLogTables: the tables of the Logs section of
// docs/observability.md have a row for every line the plugin's code
// logs (the handler's, every store's, the admin API's), at its level,
// and no row for a line the code does not log.
func TestDocsLogTables(t *testing.T) {
	code, doc := codeLogLines(t), docLogLines(t)
	if len(code) < 40 {
		t.Fatalf("only %d log lines found in the code: is the search still right? %v", len(code), code)
	}
	for _, want := range []logLine{{"error", "postgres permission missing"}, {"debug", "event passed on"}, {"warn", "redis may evict keys"}, {"warn", "memory store is neither durable nor shared"}} {
		if code[want] == nil {
			t.Errorf("the search of the code missed %v", want)
		}
	}
	var missing, stale []string
	for l, where := range code {
		if !doc[l] {
			missing = append(missing, l.level+" "+strconv.Quote(l.msg)+" ("+where[0]+")")
		}
	}
	for l := range doc {
		if code[l] == nil {
			stale = append(stale, l.level+" "+strconv.Quote(l.msg))
		}
	}
	sort.Strings(missing)
	sort.Strings(stale)
	for _, m := range missing {
		t.Errorf("docs/observability.md's log tables have no row for %s", m)
	}
	for _, s := range stale {
		t.Errorf("docs/observability.md's log tables have a row for %s, which the code does not log", s)
	}
}

// wordsAcrossLines matches words across line breaks: "a b" as a\s+b.
func wordsAcrossLines(words string) string {
	q := strings.Fields(words)
	for i := range q {
		q[i] = regexp.QuoteMeta(q[i])
	}
	return strings.Join(q, `\s+`)
}

// crashWindow is the one window of the promise that no edge can close,
// as the README and docs/stores.md state it (issue 24, item 15).
var crashWindow = regexp.MustCompile(wordsAcrossLines("if Caddy dies while the backend is working on an event, the backend may finish it, " +
	"and the sender's retry after the lease is gone is processed again"))

// leaseOutlivesCaddy is the same window on a shared store, whose lease
// survives Caddy until lock_ttl.
var leaseOutlivesCaddy = regexp.MustCompile(`(?s)` + wordsAcrossLines("the lease survives Caddy") + `.{0,120}?` +
	wordsAcrossLines("once it expires after `lock_ttl` the sender's retry is processed again"))

// markedRetry is how the window is closed (issue 26): the retry reaches
// the backend marked.
var markedRetry = regexp.MustCompile(wordsAcrossLines("`Sangho-Dedup-Prior-Attempt: unknown`"))

// TestDocsStateTheCrashWindow: the README's promise paragraph and
// docs/stores.md say that an event whose backend outlives a Caddy that
// died is processed again on the sender's retry; docs/redis.md and
// docs/postgres.md that on their store it happens once the lease expires
// after lock_ttl. Each says too that the retry reaches the backend
// marked. So that an edit cannot drop it silently while the window is
// open.
func TestDocsStateTheCrashWindow(t *testing.T) {
	readme := readRepoDoc(t, "README.md")
	i := strings.Index(readme, "\nNo event is processed twice")
	if i < 0 {
		t.Fatal("README.md: the promise paragraph (\"No event is processed twice ...\") not found")
	}
	promise := readme[i+1:]
	if j := strings.Index(promise, "\n\n"); j >= 0 {
		promise = promise[:j]
	}
	if !crashWindow.MatchString(promise) || !markedRetry.MatchString(promise) {
		t.Errorf("README.md: the promise paragraph does not state the crash window (%s) and the mark (%s):\n%s", crashWindow, markedRetry, promise)
	}
	if s := readRepoDoc(t, "docs/stores.md"); !crashWindow.MatchString(s) || !markedRetry.MatchString(s) {
		t.Errorf("docs/stores.md does not state the crash window (%s) and the mark (%s)", crashWindow, markedRetry)
	}
	for _, f := range []string{"docs/redis.md", "docs/postgres.md"} {
		if s := readRepoDoc(t, f); !leaseOutlivesCaddy.MatchString(s) || !markedRetry.MatchString(s) {
			t.Errorf("%s does not say that the lease survives Caddy and that the retry is processed again once it expires after lock_ttl (%s), marked (%s)", f, leaseOutlivesCaddy, markedRetry)
		}
	}
}

// TestReadmeTestDuration: the README says how long its test command
// takes from a cold build cache and warm, the cold figure the larger,
// and that the first minutes compile with -race in silence (issue 24,
// item 14: "about 5 minutes" alone sent a new user waiting 13).
func TestReadmeTestDuration(t *testing.T) {
	readme := readRepoDoc(t, "README.md")
	i := strings.Index(readme, "Run the tests (")
	if i < 0 {
		t.Fatal("README.md: \"Run the tests (\" not found")
	}
	sentence := readme[i:]
	sentence = sentence[:strings.Index(sentence, "```")]
	cold := regexp.MustCompile(`about (\d+) minutes from a cold build cache`).FindStringSubmatch(sentence)
	warm := regexp.MustCompile(`about (\d+) minutes\s+warm`).FindStringSubmatch(sentence)
	if cold == nil || warm == nil {
		t.Fatalf("README.md: the test command's sentence does not give \"about N minutes from a cold build cache\" and \"about N minutes warm\":\n%s", sentence)
	}
	c, _ := strconv.Atoi(cold[1])
	w, _ := strconv.Atoi(warm[1])
	if c <= w {
		t.Errorf("README.md: cold %d minutes, warm %d: the cold build is the longer", c, w)
	}
	if !strings.Contains(sentence, "`-race`") || !strings.Contains(sentence, "printing nothing") {
		t.Errorf("README.md: the test command's sentence does not warn that the first minutes compile with `-race` printing nothing:\n%s", sentence)
	}
}
