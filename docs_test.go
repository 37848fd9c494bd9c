package sanghodedup

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sangho/caddy-sangho-dedup/providers"
	filestore "github.com/sangho/caddy-sangho-dedup/stores/file"
	redisstore "github.com/sangho/caddy-sangho-dedup/stores/redis"
)

// The tests of the documentation: the README and docs/ link only to what
// exists, the README's Layout names every folder and root file, and
// docs/configuration.md lists every option.

// markdownFiles are the Markdown files whose relative links are checked.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"README.md", "bench/README.md", "reliability/README.md", "monitoring/README.md"}, docs...)
}

var (
	fencedCode = regexp.MustCompile("(?ms)^[ \t]*```.*?^[ \t]*```")
	inlineCode = regexp.MustCompile("`[^`]+`")
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)|<img src="([^"]+)"`)
	mdHeading  = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	slugDrop   = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// proseOf is a Markdown text without its code (fenced blocks and inline
// spans), where a link-like text is not a link.
func proseOf(s string) string {
	return inlineCode.ReplaceAllString(fencedCode.ReplaceAllString(s, ""), "")
}

// anchors are the ids GitHub gives the headings of a Markdown text:
// lower case, punctuation dropped, spaces as '-', "-1", "-2", ... for
// repeats.
func anchors(s string) map[string]bool {
	ids := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(fencedCode.ReplaceAllString(s, ""), -1) {
		id := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(m[1]), ""), " ", "-")
		if n := seen[id]; n > 0 {
			ids[id+"-"+strconv.Itoa(n)] = true
		} else {
			ids[id] = true
		}
		seen[id]++
	}
	return ids
}

// TestDocsLinks: every relative link (and picture) in the README, docs/
// and the other READMEs points to a file or folder that exists, and a
// link with #anchor to a heading of its Markdown target.
func TestDocsLinks(t *testing.T) {
	checked := 0
	for _, file := range markdownFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(proseOf(string(b)), -1) {
			link := m[1] + m[2]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, anchor, _ := strings.Cut(link, "#")
			resolved := file
			if target != "" {
				resolved = path.Join(path.Dir(file), target)
				if _, err := os.Stat(filepath.FromSlash(resolved)); err != nil {
					t.Errorf("%s: link %q: %s does not exist", file, link, resolved)
					continue
				}
			}
			checked++
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(resolved, ".md") {
				t.Errorf("%s: link %q: an anchor into a file that is not Markdown", file, link)
				continue
			}
			tb, err := os.ReadFile(filepath.FromSlash(resolved))
			if err != nil {
				t.Fatal(err)
			}
			if !anchors(string(tb))[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", file, link, resolved, anchor)
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links found: is the link pattern still right?", checked)
	}
}

// TestDocsAnchorIDs: the anchor ids are GitHub's, on headings of the
// kinds these files have.
func TestDocsAnchorIDs(t *testing.T) {
	got := anchors("# The generic `hmac` provider\n## A bad network, stops and restarts\n" +
		"## Slack's URL verification\n## sangho-send: sign and send events\n## Logs\n```\n# not a heading\n```\n## Logs\n")
	for _, id := range []string{"the-generic-hmac-provider", "a-bad-network-stops-and-restarts",
		"slacks-url-verification", "sangho-send-sign-and-send-events", "logs", "logs-1"} {
		if !got[id] {
			t.Errorf("no anchor %q in %v", id, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block taken for a heading")
	}
}

// readmeLayout returns the README's Layout section.
func readmeLayout(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## Layout\n")
	if i < 0 {
		t.Fatal("README.md has no Layout section")
	}
	s = s[i+len("\n## Layout\n"):]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

var backticked = regexp.MustCompile("`([^`\n]+)`")

// TestReadmeLayout: the README's Layout section names every top-level
// folder (in its table) and every non-test Go file of the root package,
// every cmd/ and internal/ package in their rows, and nothing that does
// not exist, so that it cannot drift from the tree.
func TestReadmeLayout(t *testing.T) {
	layout := readmeLayout(t)
	named := map[string]bool{}
	for _, m := range backticked.FindAllStringSubmatch(layout, -1) {
		named[m[1]] = true
		if strings.HasSuffix(m[1], ".go") || strings.HasSuffix(m[1], "/") {
			if _, err := os.Stat(m[1]); err != nil {
				t.Errorf("README Layout names %s, which does not exist", m[1])
			}
		}
	}

	// The folder table: "| `name/` | ... |", one row per top-level folder.
	rows := map[string][]string{}
	for _, l := range strings.Split(layout, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) < 4 {
			continue
		}
		first := backticked.FindStringSubmatch(cells[1])
		if first == nil || !strings.HasSuffix(first[1], "/") {
			continue
		}
		var rest []string
		for _, m := range backticked.FindAllStringSubmatch(strings.Join(cells[2:], "|"), -1) {
			rest = append(rest, m[1])
		}
		rows[first[1]] = rest
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case e.IsDir():
			if strings.HasPrefix(name, ".") && name != ".ci" {
				continue // .git, an editor's folder
			}
			if _, ok := rows[name+"/"]; !ok {
				t.Errorf("README Layout: the folder table has no row for %s/", name)
			}
		case strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go"):
			if !named[name] {
				t.Errorf("README Layout does not name %s", name)
			}
		}
	}
	for folder, names := range rows {
		if strings.Contains(strings.TrimSuffix(folder, "/"), "/") {
			t.Errorf("README Layout: %s is not a top-level folder", folder)
		}
		for _, n := range names {
			p := n
			if !strings.HasSuffix(n, "/") && !strings.HasSuffix(n, ".go") {
				p = filepath.Join(folder, n) // a name within the folder
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("README Layout: the %s row names %s, which does not exist", folder, p)
			}
		}
	}
	// Every package of cmd/ and internal/ is named in its row.
	for _, folder := range []string{"cmd/", "internal/"} {
		subs, err := os.ReadDir(folder)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range subs {
			if s.IsDir() && !contains(rows[folder], s.Name()) {
				t.Errorf("README Layout: the %s row does not name %s", folder, s.Name())
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// caddyfileOptions returns the options that the Caddyfile parsers of the
// root package accept: the string cases of the option switch (on opt, or
// on d.Val()) in each UnmarshalCaddyfile, by receiver type.
func caddyfileOptions(t *testing.T) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	var files []string
	for _, pattern := range []string{"*.go", "stores/*/*.go", "providers/*.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	opts := map[string][]string{}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "UnmarshalCaddyfile" || fn.Recv == nil || fn.Body == nil {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			typ := recv.(*ast.Ident).Name
			if dir := filepath.Dir(file); dir != "." {
				typ = filepath.Base(dir) + "." + typ // redis.Store, providers.HMAC
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sw, ok := n.(*ast.SwitchStmt)
				if !ok || !isOptionSwitch(sw.Tag) {
					return true
				}
				for _, stmt := range sw.Body.List {
					for _, e := range stmt.(*ast.CaseClause).List {
						if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							v, _ := strconv.Unquote(lit.Value)
							opts[typ] = append(opts[typ], v)
						}
					}
				}
				return false // an inner switch is on an option's value
			})
		}
	}
	return opts
}

// isOptionSwitch: the switch is on the option's name (opt, or d.Val()).
func isOptionSwitch(tag ast.Expr) bool {
	switch x := tag.(type) {
	case *ast.Ident:
		return x.Name == "opt"
	case *ast.CallExpr:
		sel, ok := x.Fun.(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "Val"
	}
	return false
}

// TestConfigurationReferenceComplete: docs/configuration.md has a table
// row for every option that a Caddyfile parser accepts (the directive's,
// each store's and the hmac provider's), names every JSON field of the
// handler, the stores and the hmac provider, and its syntax block lists
// every registered store and provider.
func TestConfigurationReferenceComplete(t *testing.T) {
	b, err := os.ReadFile("docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)

	opts := caddyfileOptions(t)
	for _, typ := range []string{"Handler", "redis.Store", "providers.HMAC", "file.Store"} {
		if len(opts[typ]) == 0 {
			t.Errorf("found no Caddyfile option of %s: is the parser still a switch on opt or d.Val()?", typ)
		}
	}
	n := 0
	for typ, names := range opts {
		for _, name := range names {
			n++
			if name == "pipeline" { // the former name, refused with a pointer to disable_pipeline
				if !strings.Contains(doc, "`pipeline ") {
					t.Errorf("docs/configuration.md does not say what became of %s's `pipeline`", typ)
				}
				continue
			}
			if !strings.Contains(doc, "\n| `"+name+"` |") {
				t.Errorf("docs/configuration.md has no table row for %s's Caddyfile option %s", typ, name)
			}
		}
	}
	if n < 40 {
		t.Errorf("only %d Caddyfile options found", n)
	}

	for _, v := range []any{Handler{}, filestore.Store{}, redisstore.Store{}, providers.HMAC{}} {
		rt := reflect.TypeOf(v)
		for i := 0; i < rt.NumField(); i++ {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			if !strings.Contains(doc, "`"+name+"`") && !strings.Contains(doc, `"`+name+`"`) {
				t.Errorf("docs/configuration.md does not name %s's JSON field %q", rt.Name(), name)
			}
		}
	}

	blocks := codeBlocks(doc, "caddyfile")
	if len(blocks) == 0 {
		t.Fatal("docs/configuration.md has no caddyfile syntax block")
	}
	listed := map[string]map[string]bool{"provider": {}, "store": {}}
	for _, l := range strings.Split(blocks[0], "\n") {
		f := strings.Fields(strings.NewReplacer("|", " ", "[", " ", "{", " ").Replace(l))
		if len(f) > 1 && listed[f[0]] != nil {
			for _, name := range f[1:] {
				listed[f[0]][name] = true
			}
		}
	}
	for kw, ns := range map[string]string{"provider": "http.sangho_dedup.providers", "store": "http.sangho_dedup.stores"} {
		var mods []string
		for _, m := range caddy.GetModules(ns) {
			mods = append(mods, m.ID.Name())
		}
		sort.Strings(mods)
		if len(mods) == 0 {
			t.Errorf("no module registered in %s", ns)
		}
		for _, name := range mods {
			if !listed[kw][name] {
				t.Errorf("docs/configuration.md's syntax block has no `%s %s` (registered: %v)", kw, name, mods)
			}
		}
	}
}

// TestReadmeStaysAManual: the README is the user's manual, not the
// reference: at most readmeMaxLines lines (issue 17 set ~350; it was
// 1,429 when reference, run logs and evidence lived in it). Reference
// goes to docs/, measurements to bench/, evidence to reliability/.
func TestReadmeStaysAManual(t *testing.T) {
	const readmeMaxLines = 400 // 387 with issue 24: a two-sender site, the crash window, PgBouncer
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move reference to docs/, measurements to bench/README.md, evidence to reliability/README.md", n, readmeMaxLines)
	}
}

// TestReadmeImportGraph: the import graph drawn in the README's Layout
// section is the one `go list` reports, package by package (imports
// within the module), and it covers every package of the module but
// cmd/, reliability/, monitoring/ and bench/ and the test helpers of
// internal/. So the drawing cannot drift, and a package that starts
// importing the root or a store shows up in review.
func TestReadmeImportGraph(t *testing.T) {
	layout := readmeLayout(t)
	blocks := codeBlocks(layout, "text")
	if len(blocks) == 0 {
		t.Fatal("README Layout has no ```text block with the import graph")
	}
	drawn := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(blocks[0]), "\n") {
		pkg, deps, ok := strings.Cut(l, "->")
		if !ok {
			t.Fatalf("README import graph: %q is not `pkg -> deps`", l)
		}
		drawn[strings.TrimSpace(pkg)] = strings.Join(strings.Fields(deps), " ")
	}
	const module = "github.com/sangho/caddy-sangho-dedup"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	testHelpers := map[string]bool{"internal/faultproxy": true, "internal/ledger": true, "internal/load": true,
		"internal/pgtest": true, "internal/redistest": true, "internal/sangho": true, "internal/testclock": true, "internal/handlertest": true}
	actual := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, imports, _ := strings.Cut(l, "|")
		pkg := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
		if pkg == "" {
			pkg = "(root)"
		}
		if testHelpers[pkg] || strings.HasPrefix(pkg, "cmd/") || strings.HasPrefix(pkg, "bench") ||
			pkg == "reliability" || pkg == "monitoring" {
			continue
		}
		var deps []string
		for _, imp := range strings.Fields(imports) {
			if imp == module {
				t.Errorf("%s imports the root package", pkg)
			} else if rest, ok := strings.CutPrefix(imp, module+"/"); ok {
				deps = append(deps, rest)
			}
		}
		sort.Strings(deps)
		actual[pkg] = strings.Join(deps, " ")
	}
	for pkg, deps := range actual {
		d, ok := drawn[pkg]
		switch {
		case !ok:
			t.Errorf("README import graph has no line for %s (-> %s)", pkg, deps)
		case d != deps:
			t.Errorf("README import graph: %s -> %s, but it imports %s", pkg, d, deps)
		}
	}
	for pkg := range drawn {
		if _, ok := actual[pkg]; !ok {
			t.Errorf("README import graph draws %s, which is not a package of the module", pkg)
		}
	}
	if actual["dedup"] != "" {
		t.Errorf("dedup must import Caddy only, imports %s", actual["dedup"])
	}
}
