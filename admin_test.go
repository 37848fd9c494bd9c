package sanghodedup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
)

// adminServer is an in-process Caddy with its admin API on a free
// loopback port and one sangho_dedup endpoint.
type adminServer struct {
	*caddyServer
	admin string
}

func startAdminCaddy(t *testing.T, site string) *adminServer {
	t.Helper()
	return startAdminCaddyLogging(t, site, "")
}

// startAdminCaddyLogging is startAdminCaddy with a second log, when
// logFile is not "": the lines of the logger admin.api.sangho_dedup,
// chosen by a filter on that name as an operator's would be, written to
// logFile as JSON. (The default log is discarded.)
func startAdminCaddyLogging(t *testing.T, site, logFile string) *adminServer {
	t.Helper()
	ownDataDir(t)
	port, admin := freePort(t), "127.0.0.1:"+strconv.Itoa(freePort(t))
	cfg := strings.Replace(serverCaddyfile(port, site), "admin off", "admin "+admin, 1)
	if logFile != "" {
		discard := "\tlog {\n\t\toutput discard\n\t}\n"
		if !strings.Contains(cfg, discard) {
			t.Fatalf("no default log block to add a log beside in:\n%s", cfg)
		}
		cfg = strings.Replace(cfg, discard, discard+"\tlog admin {\n\t\toutput file "+logFile+"\n\t\tformat json\n\t\tinclude admin.api.sangho_dedup\n\t}\n", 1)
	}
	adapted, _ := adaptCaddyfile(t, cfg)
	if err := caddy.Load([]byte(adapted), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	return &adminServer{
		caddyServer: &caddyServer{url: "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook", port: port},
		admin:       admin,
	}
}

func (a *adminServer) api(t *testing.T, method, path string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+a.admin+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var v map[string]any
	_ = json.Unmarshal(b, &v)
	return resp.StatusCode, v
}

// cli runs `caddy sangho-dedup <verb> <id> [flags]` as registered, and
// returns its exit status and output.
func (a *adminServer) cli(t *testing.T, verb, id string, flags ...string) (int, string, error) {
	t.Helper()
	return runCommand(t, verb, id, append([]string{"address", a.admin}, flags...)...)
}

// runCommand runs `caddy sangho-dedup <verb> <id>` as registered, with
// the flags given as name, value pairs.
func runCommand(t *testing.T, verb, id string, flags ...string) (int, string, error) {
	t.Helper()
	root := &cobra.Command{}
	caddycmd.Commands()["sangho-dedup"].CobraFunc(root)
	sub, _, err := root.Find([]string{verb})
	if err != nil || sub == root {
		t.Fatalf("no subcommand %s", verb)
	}
	for i := 0; i+1 < len(flags); i += 2 {
		if err := sub.Flags().Set(flags[i], flags[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	code, err := runEventCommand(sub, verb, id, &out)
	return code, out.String(), err
}

// TestAdminForgetLoggedUnderItsModule: an operator's forget is logged
// as docs/observability.md says, `event forgotten` from the logger
// admin.api.sangho_dedup with its fields, and a log that includes that
// logger gets it. (Caddy makes admin routers without loading them as
// modules of its context: ctx.Logger() alone is the unnamed logger; a
// logger named from caddy.Log() writes to the default log only.)
func TestAdminForgetLoggedUnderItsModule(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	l := ledger.New(t)
	s := startAdminCaddyLogging(t, dedupSite(l.Addr, "store memory\n\t\tname logged"), logFile)
	if a := send(t, s.url, `{"id":"evt_logged","type":"invoice.paid"}`, "evt_logged"); a.status != 200 {
		t.Fatalf("delivery: %d", a.status)
	}
	if status, v := s.api(t, http.MethodDelete, "/sangho_dedup/logged/events/evt_logged"); status != 200 || v["state"] != "done" {
		t.Fatalf("DELETE a processed event: %d %v", status, v)
	}
	entries, text := logEntries(t, logFile)
	var lines []map[string]any
	for _, e := range entries {
		if e["msg"] == "event forgotten" {
			lines = append(lines, e)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d lines \"event forgotten\" in the log that includes admin.api.sangho_dedup, want 1:\n%s", len(lines), text)
	}
	e := lines[0]
	if e["level"] != "info" || e["logger"] != "admin.api.sangho_dedup" || e["name"] != "logged" ||
		e["event_id"] != "evt_logged" || e["state"] != "done" || e["force"] != false {
		t.Errorf("the forget's log line: %v; want level info, logger admin.api.sangho_dedup, name logged, event_id evt_logged, state done, force false", e)
	}
}

// TestAdminAPIAndCommand: look up and forget events through Caddy's admin
// API and the caddy sangho-dedup command, on every store.
func TestAdminAPIAndCommand(t *testing.T) {
	forStores(t, func(t *testing.T, store string) {
		l := ledger.New(t)
		release := make(chan struct{})
		l.Behave(func(id string, n int) ledger.Action {
			if id == "evt_slow" {
				<-release
			}
			return ledger.Action{}
		})
		name := "ops_" + testPrefix(t)
		s := startAdminCaddy(t, dedupSite(l.Addr, store+"\n\t\tname "+name))
		body := func(id string) string { return fmt.Sprintf(`{"id":%q,"type":"invoice.paid"}`, id) }
		if a := send(t, s.url, body("evt_ops"), "evt_ops"); a.status != 200 {
			t.Fatalf("delivery: %d", a.status)
		}

		// the list
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.admin+"/sangho_dedup/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var list []EndpointInfo
		_ = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if len(list) != 1 || list[0].Name != name || list[0].KeyPrefix == "" || list[0].Store == "" {
			t.Fatalf("list: %+v", list)
		}
		wantStore := map[bool]string{true: "memory", false: "file"}[strings.Contains(store, "memory")]
		if strings.Contains(store, "redis") {
			wantStore = "redis"
		}
		if list[0].Store != wantStore {
			t.Errorf("store %q, want %q", list[0].Store, wantStore)
		}

		// look up
		path := "/sangho_dedup/" + name + "/events/"
		status, v := s.api(t, http.MethodGet, path+"evt_ops")
		if status != 200 || v["state"] != "done" || v["event_type"] != "invoice.paid" || v["processed_at"] == nil || v["expires_at"] == nil || v["fingerprint"] == nil {
			t.Fatalf("GET a processed event: %d %v", status, v)
		}
		if status, v := s.api(t, http.MethodGet, path+"evt_never"); status != 404 || v["state"] != "absent" {
			t.Fatalf("GET an absent event: %d %v", status, v)
		}
		if status, v := s.api(t, http.MethodGet, "/sangho_dedup/nosuch/events/evt_ops"); status != 404 || !strings.Contains(fmt.Sprint(v["error"]), "nosuch") {
			t.Fatalf("GET on an unknown name: %d %v", status, v)
		}
		if status, v := s.api(t, http.MethodGet, path+"evt%20bad"); status != 400 || v["error"] == nil {
			t.Fatalf("GET a bad ID: %d %v", status, v)
		}

		// the command line: get, then forget, then the redelivery is processed once more
		if code, out, err := s.cli(t, "get", "evt_ops"); code != 0 || err != nil || !strings.Contains(out, "evt_ops: processed") || !strings.Contains(out, "invoice.paid") {
			t.Fatalf("caddy sangho-dedup get: %d %v\n%s", code, err, out)
		}
		if code, out, err := s.cli(t, "get", "evt_never", "json", "true"); code != 1 || err != nil || !strings.Contains(out, `"state":"absent"`) {
			t.Fatalf("get of an absent event: %d %v\n%s", code, err, out)
		}
		if code, _, err := s.cli(t, "get", "evt_ops", "name", "nosuch"); code != 2 || err == nil {
			t.Fatalf("get on an unknown name: %d %v", code, err)
		}
		if code, out, err := s.cli(t, "forget", "evt_ops"); code != 0 || err != nil || !strings.Contains(out, "evt_ops: forgotten") {
			t.Fatalf("caddy sangho-dedup forget: %d %v\n%s", code, err, out)
		}
		if a := send(t, s.url, body("evt_ops"), "evt_ops"); a.status != 200 || a.dedup != "" {
			t.Fatalf("redelivery after forget: %d %q", a.status, a.dedup)
		}
		if received, _ := l.Counts("evt_ops"); received != 2 {
			t.Fatalf("the backend got the event %d times, want 2 (once more after forget)", received)
		}
		if status, v := s.api(t, http.MethodDelete, path+"evt_never"); status != 404 || v["state"] != "absent" {
			t.Fatalf("DELETE an absent event: %d %v", status, v)
		}

		// an event in flight: 409 unless forced
		done := make(chan answer)
		go func() { done <- send(t, s.url, body("evt_slow"), "evt_slow") }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if status, v := s.api(t, http.MethodGet, path+"evt_slow"); status == 200 && v["state"] == "in_flight" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the slow event never showed in flight")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if status, v := s.api(t, http.MethodDelete, path+"evt_slow"); status != 409 || !strings.Contains(fmt.Sprint(v["error"]), "in flight") {
			t.Fatalf("DELETE in flight: %d %v", status, v)
		}
		// the command speaks of its flag, not of the API's query
		if code, out, err := s.cli(t, "forget", "evt_slow"); code != 2 || err == nil || !strings.Contains(err.Error(), "in flight") ||
			!strings.Contains(err.Error(), "--force") || strings.Contains(err.Error(), "?force") {
			t.Fatalf("forget in flight without --force: exit %d, %v\n%s", code, err, out)
		}
		// --json prints the API's answer, a refusal too, for a script to read
		if code, out, err := s.cli(t, "forget", "evt_slow", "json", "true"); code != 2 || err == nil || !strings.Contains(out, `"error"`) || !strings.Contains(out, "in flight") {
			t.Fatalf("forget --json in flight: exit %d, %v, stdout %q; want 2 and the API's JSON answer on stdout", code, err, out)
		}
		if code, out, err := s.cli(t, "forget", "evt_slow", "force", "true"); code != 0 || err != nil || !strings.Contains(out, "in_flight") {
			t.Fatalf("forced forget in flight: %d %v\n%s", code, err, out)
		}
		if status, v := s.api(t, http.MethodGet, path+"evt_slow"); status != 404 {
			t.Fatalf("after a forced forget: %d %v", status, v)
		}
		close(release)
		if a := <-done; a.status != 200 {
			t.Fatalf("the slow delivery: %d", a.status)
		}
	})
}

// TestCommandPicksTheOnlyEndpoint: --name may be left out when the
// config has one endpoint, and not when it has two.
func TestCommandPicksTheOnlyEndpoint(t *testing.T) {
	l := ledger.New(t)
	s := startAdminCaddy(t, dedupSite(l.Addr, "store memory\n\t\tkey_prefix only_one:"))
	if code, out, err := s.cli(t, "get", "evt_x"); code != 1 || err != nil || !strings.Contains(out, "endpoint      only_one\n") {
		t.Fatalf("get without --name: %d %v\n%s", code, err, out)
	}
	s2 := startAdminCaddy(t, twoEndpoints(l.Addr, l.Addr, "store memory\n\t\t\tkey_prefix two_a:", "store memory\n\t\t\tkey_prefix two_b:"))
	code, _, err := s2.cli(t, "get", "evt_x")
	if code != 2 || err == nil || !strings.Contains(err.Error(), "one of two_a, two_b)") || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("get without --name on two endpoints: %d %v", code, err)
	}
}

func TestOperationsCaddyfileErrors(t *testing.T) {
	for in, want := range map[string]string{
		"on_payload_mismatch drop": `on_payload_mismatch: must be reject or log, not "drop"`,
		"on_payload_mismatch":      "on_payload_mismatch: needs a value",
		"name":                     "name: needs a value",
		"name a b":                 "name: takes one value",
		"name a\nname b":           "name given more than once",
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
	h := &Handler{Secrets: []string{"s"}, OnPayloadMismatch: "drop", StoreRaw: []byte(`{"type":"memory"}`)}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err == nil || !strings.Contains(err.Error(), "on_payload_mismatch") {
		t.Errorf("Validate of a bad on_payload_mismatch: %v", err)
	}
}

// The command reaches an admin endpoint on a unix socket, the layout
// many packaged Caddys use (admin unix//run/caddy-admin.sock): Caddy
// refuses a request that carries an Origin there, and its own CLI sends
// none.
func TestCommandOverUnixSocketAdmin(t *testing.T) {
	ownDataDir(t)
	dir, err := os.MkdirTemp("/tmp", "sd-admin") // a socket path must be short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := "unix/" + filepath.Join(dir, "admin.sock")
	l := ledger.New(t)
	port := freePort(t)
	cfg := strings.Replace(serverCaddyfile(port, dedupSite(l.Addr, "store memory\n\t\tname sock")), "admin off", "admin "+sock, 1)
	adapted, _ := adaptCaddyfile(t, cfg)
	if err := caddy.Load([]byte(adapted), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	s := &adminServer{caddyServer: &caddyServer{url: "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook", port: port}, admin: sock}
	if a := send(t, s.url, bodyA, ""); a.status != 200 {
		t.Fatalf("delivery: %d %s", a.status, a.body)
	}
	code, out, err := s.cli(t, "get", "evt_1QZtest000000000001")
	if code != 0 || err != nil || !strings.Contains(out, "processed") {
		t.Fatalf("get over %s: exit %d, %v\n%s", sock, code, err, out)
	}
	if code, out, err := s.cli(t, "forget", "evt_1QZtest000000000001"); code != 0 || err != nil {
		t.Fatalf("forget over %s: exit %d, %v\n%s", sock, code, err, out)
	}
}

// TestCommandFindsTheAdminAddressInTheConfig: like `caddy stop` and
// `caddy reload`, the command takes --config (and --adapter) to find the
// admin address in the config Caddy runs (it knew only --address and
// the default, so a Caddy with `admin 127.0.0.1:2999` or a unix socket
// needed the address typed again). --address wins over --config, and a
// config that cannot be read is an error that names it.
func TestCommandFindsTheAdminAddressInTheConfig(t *testing.T) {
	ownDataDir(t)
	l := ledger.New(t)
	port, admin := freePort(t), "127.0.0.1:"+strconv.Itoa(freePort(t))
	src := strings.Replace(serverCaddyfile(port, dedupSite(l.Addr, "store memory\n\t\tname cfg")), "admin off", "admin "+admin, 1)
	dir := t.TempDir()
	caddyfilePath, confPath := filepath.Join(dir, "Caddyfile"), filepath.Join(dir, "site.conf")
	for _, p := range []string{caddyfilePath, confPath} {
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	adapted, _ := adaptCaddyfile(t, src)
	if err := caddy.Load([]byte(adapted), true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/webhook"
	if a := send(t, url, bodyA, ""); a.status != 200 {
		t.Fatalf("delivery: %d %s", a.status, a.body)
	}
	const id = "evt_1QZtest000000000001"
	for _, flags := range [][]string{
		{"config", caddyfilePath},                              // the adapter known by the file's name, as caddy's commands do
		{"config", confPath, "adapter", "caddyfile"},           // another name: --adapter
		{"config", "/nonexistent/Caddyfile", "address", admin}, // --address first, the config is not read
	} {
		code, out, err := runCommand(t, "get", id, flags...)
		if code != 0 || err != nil || !strings.Contains(out, id+": processed") {
			t.Errorf("get %v: exit %d, %v\n%s", flags, code, err, out)
		}
	}
	code, _, err := runCommand(t, "get", id, "config", filepath.Join(dir, "missing.Caddyfile"))
	if code != 2 || err == nil || !strings.Contains(err.Error(), "missing.Caddyfile") {
		t.Errorf("get with a config that does not exist: exit %d, %v", code, err)
	}
}

// TestCommandDefaultEndpointName: an endpoint with no `name` and the
// default key_prefix is named "sangho_dedup", without the prefix's
// trailing colon (it showed in the command's output, in the list and in
// every admin URL); a key_prefix of one's own gives its name the same
// way. The name before, the key_prefix itself, still reaches the
// endpoint, so that scripts written against it keep working.
func TestCommandDefaultEndpointName(t *testing.T) {
	l := ledger.New(t)
	s := startAdminCaddy(t, dedupSite(l.Addr, "store memory"))
	if a := send(t, s.url, bodyA, ""); a.status != 200 {
		t.Fatalf("delivery: %d %s", a.status, a.body)
	}
	const id = "evt_1QZtest000000000001"
	resp, err := http.Get("http://" + s.admin + "/sangho_dedup/")
	if err != nil {
		t.Fatal(err)
	}
	var list []EndpointInfo
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 1 || list[0].Name != "sangho_dedup" || list[0].KeyPrefix != "sangho_dedup:" {
		t.Fatalf("the endpoints: %+v, want one named sangho_dedup with key_prefix sangho_dedup:", list)
	}
	code, out, err := s.cli(t, "get", id)
	if code != 0 || err != nil || !strings.Contains(out, "  endpoint      sangho_dedup\n") {
		t.Fatalf("get: exit %d, %v\n%s", code, err, out)
	}
	for _, name := range []string{"sangho_dedup", "sangho_dedup:", "sangho_dedup%3A"} {
		if status, v := s.api(t, http.MethodGet, "/sangho_dedup/"+name+"/events/"+id); status != 200 || v["state"] != "done" || v["endpoint"] != "sangho_dedup" {
			t.Errorf("GET through the name %s: %d %v, want state done from the endpoint sangho_dedup", name, status, v)
		}
	}
	// The name before reaches the endpoint, which is named as it is now.
	if code, out, err := s.cli(t, "get", id, "name", "sangho_dedup:"); code != 0 || err != nil || !strings.Contains(out, "  endpoint      sangho_dedup\n") {
		t.Errorf("get --name sangho_dedup: (the name before): exit %d, %v, want the endpoint named sangho_dedup\n%s", code, err, out)
	}
}

// A record written before event types were cleaned (or by another
// writer of the store) may hold a terminal escape or a bidi override:
// the admin API, and the command that prints its answer, show it
// cleaned, as the handler logs it.
func TestAdminShowsARecordsEventTypeCleaned(t *testing.T) {
	rec := dedup.DoneRecord{ProcessedAt: time.Unix(1733140801, 0), EventType: "paid\x1b[2J\u202edeliaf", Fingerprint: "0123456789abcdef0123456789abcdef"}
	info := eventInfo("default", "evt_1", dedup.Entry{Value: rec.Encode(), ExpiresAt: time.Now().Add(time.Hour)})
	if want := "paid\uFFFD[2J\uFFFDdeliaf"; info.State != "done" || info.EventType != want {
		t.Fatalf("eventInfo: state %s, event_type %q; want done, %q", info.State, info.EventType, want)
	}
}

// TestCLIUsageErrorsExit2: a mistake in the command line (an unknown
// flag, a missing or extra event ID, an unknown subcommand) exits 2,
// "any error", as the command's help says, never 1, which says the
// store has nothing for the event: a script reading 1 as "never
// processed" would be told so by a typo. (Found by review: Caddy's main
// exits 1 on any error cobra returns.) Run as a real process: the exit
// status is what is tested.
func TestCLIUsageErrorsExit2(t *testing.T) {
	if args := os.Getenv("SANGHO_DEDUP_TEST_CLI_ARGS"); args != "" {
		os.Args = append([]string{"caddy"}, strings.Fields(args)...)
		caddycmd.Main()
		os.Exit(0)
	}
	for _, c := range []struct{ args, says string }{
		{"sangho-dedup forget evt_1 --address 127.0.0.1:1 --forc", "unknown flag: --forc"},
		{"sangho-dedup get --address 127.0.0.1:1", "one event ID"},
		{"sangho-dedup get evt_1 evt_2 --address 127.0.0.1:1", "one event ID"},
		{"sangho-dedup bogus evt_1", `unknown subcommand "bogus"`},
		{"sangho-dedup", "get or forget"},
	} {
		if code, stderr := runCLI(t, c.args); code != 2 || !strings.Contains(stderr, c.says) {
			t.Errorf("caddy %s: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.says)
		}
	}
}

// runCLI runs `caddy <args>` as a process of its own (this test binary,
// through TestCLIUsageErrorsExit2's hook), and returns its exit status
// and what it wrote on stderr.
func runCLI(t *testing.T, args string) (code int, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCLIUsageErrorsExit2$")
	cmd.Env = append(os.Environ(), "SANGHO_DEDUP_TEST_CLI_ARGS="+args)
	var buf bytes.Buffer
	cmd.Stderr = &buf
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, buf.String()
}

// TestCommandAdminAddressAsURL: --address taken as a URL, the way the
// admin API's address is written in a browser or curl
// (http://localhost:2019, with or without a trailing slash), reaches it;
// it was taken as a network named "http:" and failed with "no Host". An
// https:// address (Caddy's remote admin, which needs client
// certificates) is refused with a message that says what to give.
func TestCommandAdminAddressAsURL(t *testing.T) {
	l := ledger.New(t)
	s := startAdminCaddy(t, dedupSite(l.Addr, "store memory\n\t\tname url"))
	for _, addr := range []string{"http://" + s.admin, "http://" + s.admin + "/"} {
		code, out, err := runCommand(t, "get", "evt_never", "address", addr)
		if code != 1 || err != nil || !strings.Contains(out, "evt_never: no record") {
			t.Errorf("get --address %s: exit %d, %v\n%s; want 1 and no record", addr, code, err, out)
		}
	}
	// A scheme in any case (RFC 3986), and a URL with a path, as
	// pasted from a browser: the host and port are the address.
	for _, addr := range []string{"HTTP://" + s.admin, "Http://" + s.admin + "/", "http://" + s.admin + "/config/"} {
		code, out, err := runCommand(t, "get", "evt_never", "address", addr)
		if code != 1 || err != nil || !strings.Contains(out, "evt_never: no record") {
			t.Errorf("get --address %s: exit %d, %v\n%s; want 1 and no record", addr, code, err, out)
		}
	}
	for _, addr := range []string{"https://" + s.admin, "HTTPS://" + s.admin} {
		code, _, err := runCommand(t, "get", "evt_never", "address", addr)
		if code != 2 || err == nil || !strings.Contains(err.Error(), "https://") || !strings.Contains(err.Error(), "--address "+s.admin) {
			t.Errorf("get --address %s: exit %d, %v; want 2 and a message naming https:// and the address to give", addr, code, err)
		}
	}
	// A URL without a port is not taken for port 80 or 0.
	code, _, err := runCommand(t, "get", "evt_never", "address", "http://localhost")
	if code != 2 || err == nil || !strings.Contains(err.Error(), "port") {
		t.Errorf("get --address http://localhost: exit %d, %v; want 2 and a message asking for the port", code, err)
	}
}

// TestCommandConfigWithAdminOff: a config whose admin API is off (`admin
// off`) makes the command say so and name the config, not report the
// default address's "connection refused" as if Caddy were down.
func TestCommandConfigWithAdminOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(path, []byte(serverCaddyfile(freePort(t), dedupSite("127.0.0.1:1", "store memory"))), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, err := runCommand(t, "get", "evt_1", "config", path)
	if code != 2 || err == nil || !strings.Contains(err.Error(), "admin off") || !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "refused") {
		t.Fatalf("get --config <admin off>: exit %d, %v; want 2 and a message that names admin off and %s", code, err, path)
	}
}

// TestCommandNoCaddyAtTheAddress: nothing listening at the admin address
// is said in words (is Caddy running there?) with the address and the
// flags that give another, besides the dial error.
func TestCommandNoCaddyAtTheAddress(t *testing.T) {
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	code, _, err := runCommand(t, "get", "evt_1", "address", addr)
	if code != 2 || err == nil || !strings.Contains(err.Error(), "is Caddy running") || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "--config") {
		t.Fatalf("get --address %s with nothing there: exit %d, %v; want 2 and a message that asks whether Caddy runs there", addr, code, err)
	}
}

// TestCommandJSONPrintsAListingRefusal: --json prints the admin API's
// answer whatever it is, the refusal of the endpoint listing too (a
// Caddy without this plugin, an admin origin check), as it does for an
// event's. (Found by review.)
func TestCommandJSONPrintsAListingRefusal(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":"not found"}`)
	}))
	defer api.Close()
	addr := strings.TrimPrefix(api.URL, "http://")
	code, out, err := runCommand(t, "get", "evt_1", "address", addr, "json", "true")
	if code != 2 || err == nil || strings.TrimSpace(out) != `{"error":"not found"}` {
		t.Fatalf("get --json, the listing refused: exit %d, %v, stdout %q; want 2 and the API's answer on stdout", code, err, out)
	}
}
