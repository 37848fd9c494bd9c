package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
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
// history meant to fire it and stays quiet on the other.
func TestRulesPromtool(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", ruleTestsFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
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
		"SanghoDedupRedisEviction", "SanghoDedupLocalCacheOff",
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
// dashboard JSON model (Grafana itself is not available here): a uid,
// a title, a schemaVersion, a datasource variable of type datasource
// used by every panel and target (so the import asks for no fixed data
// source), unique panel IDs with a gridPos inside the 24-column grid,
// and targets with a refId and an expr. The panels the issue asks for
// are there.
func TestDashboardSchema(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 {
		t.Errorf("uid %q, title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}") {
			t.Errorf("variable %s does not use the datasource variable", v.Name)
		}
	}
	if vars["datasource"] != "datasource" || vars["instance"] != "query" || vars["endpoint"] != "query" {
		t.Errorf("variables %v: want datasource (datasource), instance and endpoint (query)", vars)
	}
	ids := map[int]bool{}
	titles := ""
	for _, p := range d.Panels {
		titles += strings.ToLower(p.Title) + "\n"
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d missing or not unique", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type != "timeseries" || p.Description == "" || p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %q: type %q, a description and a unit wanted", p.Title, p.Type)
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if g := p.GridPos; g == nil || g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no targets", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
		}
	}
	for _, want := range []string{"outcomes per second", "duplicate ratio", "store latency", "store errors", "in flight and held", "signature failures by reason", "commit retries"} {
		if !strings.Contains(titles, want) {
			t.Errorf("no panel %q", want)
		}
	}
}

// exporterSeries gathers the series this module exports, from the
// registry of a config that provisioned the handler: name → type.
func exporterSeries(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	// Every store registers its own series when provisioned (a store's
	// connection is made on first use: no server is needed here).
	file, _ := json.Marshal(map[string]string{"type": "file", "path": filepath.Join(t.TempDir(), "dedup.db")})
	for i, store := range []json.RawMessage{file, json.RawMessage(`{"type":"redis","address":["127.0.0.1:1"]}`)} {
		h := &sanghodedup.Handler{Secrets: []string{"whsec_monitoring"}, StoreRaw: store, KeyPrefix: fmt.Sprintf("m%d:", i)}
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("provision: %v", err)
		}
	}
	families, err := ctx.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "caddy_sangho_dedup_") {
			got[f.GetName()] = strings.ToLower(f.GetType().String())
		}
	}
	return got
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
