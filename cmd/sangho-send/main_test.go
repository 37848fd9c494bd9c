package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMain runs main itself when the test binary is started by a test
// below as sangho-send.
func TestMain(m *testing.M) {
	if os.Getenv("SANGHO_SEND_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// run runs this test binary as sangho-send with args and the secret in
// the environment, and returns what it printed.
func run(t *testing.T, secret string, args ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SANGHO_SEND_TEST_MAIN=1", "SANGHO_WEBHOOK_SECRET="+secret)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// TestSecretFromTheEnvironmentNotPrinted: the flag package prints a
// flag's default in its usage text, on -h and after a bad flag; the
// secret taken from SANGHO_WEBHOOK_SECRET was that default, and was
// printed whole.
func TestSecretFromTheEnvironmentNotPrinted(t *testing.T) {
	const secret = "whsec_TOPSECRET_value"
	for _, args := range [][]string{
		{"event", "-h"}, {"event", "--bogus"}, {"sign", "-h"}, {"load", "--bogus"},
	} {
		out := run(t, secret, args...)
		if strings.Contains(out, "TOPSECRET") {
			t.Errorf("sangho-send %s printed the secret:\n%s", strings.Join(args, " "), out)
		}
		if !strings.Contains(out, "default $SANGHO_WEBHOOK_SECRET") {
			t.Errorf("sangho-send %s: no usage text:\n%s", strings.Join(args, " "), out)
		}
	}
	// The secret from the environment is still the one used.
	cmd := exec.Command(os.Args[0], "sign", "--t", "1733140800")
	cmd.Env = append(os.Environ(), "SANGHO_SEND_TEST_MAIN=1", "SANGHO_WEBHOOK_SECRET=whsec_test_secret_1")
	cmd.Stdin = strings.NewReader(`{"id":"evt_1"}`)
	out, err := cmd.Output()
	withFlag := exec.Command(os.Args[0], "sign", "--t", "1733140800", "--secret", "whsec_test_secret_1")
	withFlag.Env = append(os.Environ(), "SANGHO_SEND_TEST_MAIN=1", "SANGHO_WEBHOOK_SECRET=")
	withFlag.Stdin = strings.NewReader(`{"id":"evt_1"}`)
	want, werr := withFlag.Output()
	if err != nil || werr != nil || len(out) == 0 || string(out) != string(want) {
		t.Fatalf("sign with the secret in the environment: %q %v; with --secret: %q %v", out, err, want, werr)
	}
}

// TestFailuresExitNonZero: a run in which no delivery got an answer (the
// endpoint down) exits 1, and a negative or zero count or duration is
// refused at once, exit 1, naming the flag. (Found by review: event and
// load printed their connection errors and exited 0, and load
// --duration -1s sent until killed.) Each run is bounded by 20 s.
func TestFailuresExitNonZero(t *testing.T) {
	const down = "http://127.0.0.1:1/"
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"event", "--url", down, "--repeat", "2"}, "no delivery was answered"},
		{[]string{"load", "--url", down, "--events", "3", "--concurrency", "1"}, "no delivery was answered"},
		{[]string{"event", "--url", down, "--repeat", "0"}, "--repeat"},
		{[]string{"load", "--url", down, "--duration", "-1s"}, "--duration"},
		{[]string{"load", "--url", down, "--events", "-1"}, "--events"},
		{[]string{"load", "--url", down, "--concurrency", "0"}, "--concurrency"},
		{[]string{"load", "--url", down, "--rate", "-5"}, "--rate"},
		{[]string{"load", "--url", down, "--body-size", "-1"}, "--body-size"},
		{[]string{"load", "--url", down, "--duplicates", "1.5"}, "--duplicates"},
		{[]string{"load", "--url", down, "--duplicates", "-0.1"}, "--duplicates"},
		{[]string{"event", "--url", down, "--data", "{not json"}, "--data is not valid JSON"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], c.args...)
		cmd.Env = append(os.Environ(), "SANGHO_SEND_TEST_MAIN=1", "SANGHO_WEBHOOK_SECRET=whsec_test_secret_1")
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if timedOut || code != 1 || !strings.Contains(string(out), c.says) {
			t.Errorf("sangho-send %s: exit %d (timed out: %v), output:\n%s\nwant exit 1 and %q", strings.Join(c.args, " "), code, timedOut, out, c.says)
		}
	}
}

// TestSinkOnATakenPortSaysSoOnly: sink says it listens only once it
// does; on a port taken it fails, exit 1, without first saying it
// listens. (Found by review: "sink listening on ..." then "address
// already in use".)
func TestSinkOnATakenPortSaysSoOnly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "sink", "--listen", ln.Addr().String())
	cmd.Env = append(os.Environ(), "SANGHO_SEND_TEST_MAIN=1")
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 1 || strings.Contains(string(out), "listening") || !strings.Contains(string(out), "address already in use") {
		t.Errorf("sink on a taken port: exit %d, output:\n%s\nwant exit 1, the bind error, and no \"listening\"", code, out)
	}
}

// TestUsageMistakesExit2: no command, or one it does not know, exits 2
// with the usage; no secret at all exits 1 and says how to give one,
// before anything is sent. (Mutants that exited 0 there, or signed
// with an empty secret, survived the mutation pass.)
func TestUsageMistakesExit2(t *testing.T) {
	for _, c := range []struct {
		args   []string
		secret string
		code   int
		says   string
	}{
		{nil, "whsec_test_secret_1", 2, "event"},
		{[]string{"bogus"}, "whsec_test_secret_1", 2, `unknown command "bogus"`},
		{[]string{"event", "--url", "http://127.0.0.1:1/"}, "", 1, "no secret: give --secret or set SANGHO_WEBHOOK_SECRET"},
		{[]string{"sign"}, "", 1, "no secret"},
	} {
		cmd := exec.Command(os.Args[0], c.args...)
		cmd.Env = append(os.Environ(), "SANGHO_SEND_TEST_MAIN=1", "SANGHO_WEBHOOK_SECRET="+c.secret)
		cmd.Stdin = strings.NewReader(`{"id":"evt_1"}`)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != c.code || !strings.Contains(string(out), c.says) {
			t.Errorf("sangho-send %s: exit %d, output:\n%s\nwant exit %d and %q", strings.Join(c.args, " "), code, out, c.code, c.says)
		}
	}
}
