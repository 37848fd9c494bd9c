package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.yaml.in/yaml/v3"

	sanghodedup "github.com/sangho/caddy-sangho-dedup"
)

const (
	rulesFile     = "sangho-dedup.rules.yml"
	ruleTestsFile = "sangho-dedup.rules.test.yml"
	dashboardFile = "dashboard.json"
)

// tool returns the path of promtool or prometheus, or fails the test:
// these tests never skip for a missing tool (go test -short leaves them
// out: that tier needs nothing but Go).
func tool(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs " + name)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed or not in PATH: the monitoring tests need it (Debian: apt-get install prometheus, which brings promtool; .ci/run installs it)", name)
	}
	return p
}

// TestRulesPromtool: the rule file is valid (promtool check rules) and
// its unit tests pass (promtool test rules): each alert fires on the
// history meant to fire it and stays quiet on the other. The commands
// are the README's, run as written from the repository's root, where
// the README says to run them.
func TestRulesPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	var checked, tested bool
	for _, l := range strings.Split(strings.TrimSpace(recipe(t, "README.md", "promtool")), "\n") {
		args := strings.Fields(l)
		if len(args) < 4 || args[0] != "promtool" || args[2] != "rules" {
			t.Fatalf("README.md: %q is not a promtool ... rules command", l)
		}
		checked = checked || args[1] == "check" && slices.Contains(args[3:], "monitoring/"+rulesFile)
		tested = tested || args[1] == "test" && slices.Contains(args[3:], "monitoring/"+ruleTestsFile)
		cmd := exec.Command(promtool, args[1:]...)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s (from the repository's root): %v\n%s", l, err, out)
		}
	}
	if !checked || !tested {
		t.Errorf("README.md's promtool commands do not check monitoring/%s and test monitoring/%s", rulesFile, ruleTestsFile)
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules", rulesFile)
	}
	return rules
}

// TestRulesComplete: every rule is an alert with a severity
// (critical, warning or info), a summary and a description, and the
// alerts the issue asks for are there.
func TestRulesComplete(t *testing.T) {
	names := map[string]bool{}
	for _, r := range loadRules(t) {
		if r.Alert == "" {
			t.Errorf("a recording rule (%s): the file holds alerts only", r.Expr)
			continue
		}
		names[r.Alert] = true
		if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("%s: severity %q", r.Alert, s)
		}
		if len(r.Annotations["summary"]) < 20 || len(r.Annotations["description"]) < 80 {
			t.Errorf("%s: summary or description missing or too short to say what to do", r.Alert)
		}
	}
	for _, want := range []string{
		"SanghoDedupStoreUnavailable", "SanghoDedupStoreErrors", "SanghoDedupCommitRetrying",
		"SanghoDedupCommitAbandoned", "SanghoDedupEventsHeld", "SanghoDedupSignatureFailures",
		"SanghoDedupPayloadMismatch", "SanghoDedupInFlightPersists", "SanghoDedupRedisPermissionMissing",
		"SanghoDedupRedisEviction", "SanghoDedupLocalCacheOff", "SanghoDedupPostgresProblem",
	} {
		if !names[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// TestRuleTestsCoverEveryRule: for every alert, the promtool tests hold
// a history that fires it (exp_alerts not empty) and one that must not
// (exp_alerts empty), and test no alert the rule file lacks.
func TestRuleTestsCoverEveryRule(t *testing.T) {
	b, err := os.ReadFile(ruleTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			Name  string `yaml:"name"`
			Input []struct {
				Series string `yaml:"series"`
			} `yaml:"input_series"`
			Alerts []struct {
				Alertname string           `yaml:"alertname"`
				Exp       []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.RuleFiles, []string{rulesFile}) {
		t.Errorf("rule_files %v, want [%s]", f.RuleFiles, rulesFile)
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range f.Tests {
		if len(tc.Input) == 0 {
			t.Errorf("test %q has no input series", tc.Name)
		}
		for _, a := range tc.Alerts {
			if len(a.Exp) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	rules := map[string]bool{}
	for _, r := range loadRules(t) {
		rules[r.Alert] = true
		if fires[r.Alert] == 0 {
			t.Errorf("%s: no promtool test where it fires", r.Alert)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("%s: no promtool test where it must stay quiet (exp_alerts empty)", r.Alert)
		}
	}
	for name := range fires {
		if !rules[name] {
			t.Errorf("tests an alert the rule file lacks: %s", name)
		}
	}
	for name := range quiet {
		if !rules[name] {
			t.Errorf("tests an alert the rule file lacks: %s", name)
		}
	}
}

type dashboard struct {
	// Inputs and Requires are Grafana's import format (what "Export for
	// sharing externally" writes): the import asks for each input.
	Inputs []struct {
		Name     string `json:"name"`
		Label    string `json:"label"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Requires []struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"__requires"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
			Datasource *datasourceRef  `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description"`
	Datasource  *datasourceRef `json:"datasource"`
	GridPos     *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr         string         `json:"expr"`
		LegendFormat string         `json:"legendFormat"`
		RefID        string         `json:"refId"`
		Datasource   *datasourceRef `json:"datasource"`
	} `json:"targets"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// TestDashboardSchema: dashboard.json keeps to Grafana's documented
// dashboard JSON model and import format (Grafana itself is not
// available here): a uid, a title, a schemaVersion; one __inputs entry,
// a Prometheus data source, so that the import asks which Prometheus to
// use, and __requires naming Grafana, that data source and every panel
// type; every panel, target and query variable on that input, none on a
// fixed data source or a variable the import does not set; unique panel
// IDs with a gridPos inside the 24-column grid, and targets with a refId
// and an expr. The panels the issue asks for are there.
func TestDashboardSchema(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 {
		t.Errorf("uid %q, title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	if len(d.Inputs) != 1 || d.Inputs[0].Name != "DS_PROMETHEUS" || d.Inputs[0].Type != "datasource" ||
		d.Inputs[0].PluginID != "prometheus" || d.Inputs[0].Label == "" {
		t.Fatalf("__inputs %+v: want one, DS_PROMETHEUS, of type datasource, pluginId prometheus, with a label", d.Inputs)
	}
	ds := "${" + d.Inputs[0].Name + "}"
	requires := map[string]bool{}
	for _, r := range d.Requires {
		requires[r.Type+"/"+r.ID] = true
	}
	for _, want := range []string{"grafana/grafana", "datasource/prometheus"} {
		if !requires[want] {
			t.Errorf("__requires has no %s: %+v", want, d.Requires)
		}
	}
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	// Every ${...} in a uid is the input: a leftover ${datasource} would
	// be a variable the import leaves unset.
	for _, m := range regexp.MustCompile(`"uid":\s*"(\$\{[^}]*\})"`).FindAllStringSubmatch(string(b), -1) {
		if m[1] != ds {
			t.Errorf("a datasource uid %s: the import sets only %s", m[1], ds)
		}
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != ds) {
			t.Errorf("variable %s: datasource %+v, want the input %s", v.Name, v.Datasource, ds)
		}
	}
	if vars["instance"] != "query" || vars["endpoint"] != "query" {
		t.Errorf("variables %v: want instance and endpoint (query)", vars)
	}
	ids := map[int]bool{}
	titles := ""
	for _, p := range d.Panels {
		titles += strings.ToLower(p.Title) + "\n"
		if !requires["panel/"+p.Type] {
			t.Errorf("panel %q: __requires has no panel/%s", p.Title, p.Type)
		}
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d missing or not unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type != "timeseries" || p.Description == "" || p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %q: type %q, a description and a unit wanted", p.Title, p.Type)
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != ds {
			t.Errorf("panel %q: datasource %+v, want the input %s", p.Title, p.Datasource, ds)
		}
		if g := p.GridPos; g == nil || g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no targets", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource == nil || tg.Datasource.UID != ds {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
		}
	}
	for _, want := range []string{"outcomes per second", "duplicate ratio", "store latency", "store errors", "in flight and held",
		"signature failures by reason", "commit retries", "redis checks", "postgresql checks"} {
		if !strings.Contains(titles, want) {
			t.Errorf("no panel %q", want)
		}
	}
}

// storeConfigs is a config of every store module that registers
// series, for exporterFamilies: a store connects on first use, so no
// server is needed. A store registered in Caddy but missing here fails
// the tests that use it (its series would go unchecked).
func storeConfigs(t *testing.T) map[string]json.RawMessage {
	file, _ := json.Marshal(map[string]string{"type": "file", "path": filepath.Join(t.TempDir(), "dedup.db")})
	return map[string]json.RawMessage{
		"file":     file,
		"memory":   nil, // registers no series (memoryRegistersNoSeries), and warns at every load
		"redis":    json.RawMessage(`{"type":"redis","address":["127.0.0.1:1"]}`),
		"postgres": json.RawMessage(`{"type":"postgres","dsn":"postgres://monitoring@127.0.0.1:1/monitoring?sslmode=disable"}`),
	}
}

// metricFamily is what exporterFamilies tells of a metric family: its type
// and the values of its problem label.
type metricFamily struct {
	typ      string
	problems []string
	outcomes []string // the outcome label's values, each at 0 from the start
}

// exporterFamilies gathers the series this module exports, from the
// registry of a config that provisioned the handler on every registered
// store: name → family.
func exporterFamilies(t *testing.T) map[string]metricFamily {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	configs := storeConfigs(t)
	mods := caddy.GetModules("http.sangho_dedup.stores")
	if len(mods) == 0 {
		t.Fatal("no store module registered")
	}
	for i, m := range mods {
		store, ok := configs[m.ID.Name()]
		if !ok {
			t.Fatalf("store %s is registered but storeConfigs has no config for it: add one, so that its series are checked", m.ID.Name())
		}
		if store == nil {
			continue
		}
		h := &sanghodedup.Handler{Secrets: []string{"whsec_monitoring"}, StoreRaw: store, KeyPrefix: fmt.Sprintf("m%d:", i)}
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("provision on store %s: %v", m.ID.Name(), err)
		}
	}
	families, err := ctx.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]metricFamily{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "caddy_sangho_dedup_") {
			continue
		}
		mf := metricFamily{typ: strings.ToLower(f.GetType().String())}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "problem" {
					mf.problems = append(mf.problems, l.GetValue())
				}
				if l.GetName() == "outcome" && !slices.Contains(mf.outcomes, l.GetValue()) {
					mf.outcomes = append(mf.outcomes, l.GetValue())
				}
			}
		}
		ours[f.GetName()] = mf
	}
	return ours
}

// TestDashboardDuplicateRatioOverEverySettledDelivery: the Duplicate
// ratio panel divides the duplicates by every settled delivery: each
// outcome the handler counts is either one (in the denominator) or not,
// and a new outcome must be put on one side here. (Found by a new-user
// walk-through: processed_marked was left out, and the ratio read high
// after a crash.)
func TestDashboardDuplicateRatioOverEverySettledDelivery(t *testing.T) {
	duplicates := []string{"duplicate", "payload_mismatch"}
	settled := append([]string{"processed", "processed_marked", "unchecked"}, duplicates...)
	notSettled := []string{"in_flight", "invalid_signature", "bad_request", "too_large", "store_error", "released", "held"}
	outcomes := exporterFamilies(t)["caddy_sangho_dedup_events_total"].outcomes
	if len(outcomes) == 0 {
		t.Fatal("caddy_sangho_dedup_events_total has no outcome series")
	}
	for _, o := range outcomes {
		if !slices.Contains(settled, o) && !slices.Contains(notSettled, o) {
			t.Errorf("outcome %s is neither settled nor not: put it on a side here, and in the panel's query if settled", o)
		}
	}
	var expr string
	for _, p := range loadDashboard(t).Panels {
		if p.Title == "Duplicate ratio" && len(p.Targets) == 1 {
			expr = p.Targets[0].Expr
		}
	}
	num, den, ok := strings.Cut(expr, ") / sum")
	if !ok {
		t.Fatalf("the Duplicate ratio panel's query is not a quotient of sums: %q", expr)
	}
	selected := func(part string) []string {
		m := regexp.MustCompile(`outcome=~\\?"([^"\\]+)\\?"`).FindStringSubmatch(part)
		if m == nil {
			t.Fatalf("no outcome=~ selector in %q", part)
		}
		got := strings.Split(m[1], "|")
		slices.Sort(got)
		return got
	}
	slices.Sort(duplicates)
	slices.Sort(settled)
	if got := selected(num); !slices.Equal(got, duplicates) {
		t.Errorf("the ratio's numerator selects %v; want %v", got, duplicates)
	}
	if got := selected(den); !slices.Equal(got, settled) {
		t.Errorf("the ratio's denominator selects %v; want every settled outcome, %v", got, settled)
	}
}

// TestMemoryRegistersNoSeries: the memory store imports no Prometheus
// package, so exporterFamilies may leave it out.
func TestMemoryRegistersNoSeries(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "stores", "memory", "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("stores/memory: %v %v", files, err)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.Contains(p, "prometheus") || strings.HasSuffix(p, "/promreg") {
				t.Errorf("%s imports %s: give storeConfigs a memory config, so that its series are checked", file, p)
			}
		}
	}
}

// exporterSeries is exporterFamilies as name → type.
func exporterSeries(t *testing.T) map[string]string {
	t.Helper()
	got := map[string]string{}
	for name, f := range exporterFamilies(t) {
		got[name] = f.typ
	}
	return got
}

// TestRulesAlertOnEveryStoreProblem: for every problem a store's checks
// count (the problem label of each *_problems_total series the stores
// export, at 0 from the start), an alert's expression selects it: a
// store's problem cannot go without an alert.
func TestRulesAlertOnEveryStoreProblem(t *testing.T) {
	rules := loadRules(t)
	n := 0
	for name, f := range exporterFamilies(t) {
		if !strings.HasSuffix(name, "_problems_total") {
			continue
		}
		if len(f.problems) == 0 {
			t.Errorf("%s: no series with a problem label", name)
		}
		for _, problem := range f.problems {
			n++
			if !slices.ContainsFunc(rules, func(r rule) bool { return selects(r.Expr, name, problem) }) {
				t.Errorf("no alert selects %s{problem=%q}", name, problem)
			}
		}
	}
	if n < 5 {
		t.Errorf("only %d store problems found (Redis's and PostgreSQL's are exported at 0 from the start)", n)
	}
}

// selects says whether a PromQL expression selects series name with
// the label problem=value: a selector of name with no problem matcher,
// or one whose = or =~ matcher matches value.
func selects(expr, name, value string) bool {
	sel := regexp.MustCompile(regexp.QuoteMeta(name) + `(?:\{([^}]*)\})?`)
	matcher := regexp.MustCompile(`problem\s*(=~|!=|!~|=)\s*"([^"]*)"`)
	for _, m := range sel.FindAllStringSubmatch(expr, -1) {
		pm := matcher.FindStringSubmatch(m[1])
		switch {
		case pm == nil:
			return true
		case pm[1] == "=" && pm[2] == value:
			return true
		case pm[1] == "=~" && regexp.MustCompile("^(?:"+pm[2]+")$").MatchString(value):
			return true
		}
	}
	return false
}

// docsMetricTable parses the metric table of the Metrics section of
// docs/observability.md (the README links there): name → type.
func docsMetricTable(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "observability.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## Metrics\n")
	if i < 0 {
		t.Fatal("docs/observability.md has no Metrics section")
	}
	s = s[i+1:]
	if j := strings.Index(s[3:], "\n## "); j >= 0 {
		s = s[:j+3]
	}
	row := regexp.MustCompile("(?m)^\\| `(caddy_sangho_dedup_[a-z_]+)` \\| (counter|gauge|histogram) \\|")
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(s, -1) {
		if _, dup := got[m[1]]; dup {
			t.Errorf("docs/observability.md lists %s twice", m[1])
		}
		got[m[1]] = m[2]
	}
	return got
}

// TestDocsMetricTable: the metric table of docs/observability.md lists
// every series the exporter registers, with its type, and nothing else.
func TestDocsMetricTable(t *testing.T) {
	exported, table := exporterSeries(t), docsMetricTable(t)
	if len(exported) < 5 {
		t.Fatalf("the exporter registered only %v", exported)
	}
	var missing, extra []string
	for name, typ := range exported {
		if table[name] != typ {
			missing = append(missing, name+" ("+typ+")")
		}
	}
	for name, typ := range table {
		if exported[name] != typ {
			extra = append(extra, name+" ("+typ+")")
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("exported but not in the metric table of docs/observability.md (or with another type): %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("in the metric table of docs/observability.md but not exported: %v", extra)
	}
}

// TestReadmeLinksSayWhereTheyGo: a link of monitoring/README.md whose
// sentence sends the reader to "the README" leads to a README, and one
// that sends them to the metric table leads to the file that has it
// (issue 24: "listed in the main README" linked to docs/observability.md).
func TestReadmeLinksSayWhereTheyGo(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	link := regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)\)`)
	n := 0
	for _, m := range link.FindAllStringSubmatchIndex(s, -1) {
		before := s[max(0, m[0]-80):m[0]]
		if k := strings.LastIndexAny(before, ".:;"); k >= 0 {
			before = before[k+1:] // this sentence only
		}
		target := s[m[4]:m[5]]
		file, _, _ := strings.Cut(target, "#")
		if strings.Contains(before, "README") && !strings.HasSuffix(file, "README.md") {
			t.Errorf("monitoring/README.md: %q sends the reader to a README, but the link goes to %s", strings.TrimSpace(before)+s[m[0]:m[1]], target)
		}
		if strings.Contains(before, "series") && strings.Contains(before, "listed") {
			n++
			if target != "../docs/observability.md#metrics" {
				t.Errorf("monitoring/README.md: the series are listed in docs/observability.md#metrics, but the link goes to %s", target)
			}
		}
	}
	if n == 0 {
		t.Error("monitoring/README.md no longer says where the series are listed (the metric table of docs/observability.md)")
	}
}
