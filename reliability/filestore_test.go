package reliability

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/ledger"
	"github.com/sangho/caddy-sangho-dedup/internal/testkit/netkit"
)

// TestDefaultStoreKilledAndRestarted: one Caddy on the default config
// (no store line: the file store in Caddy's data directory) is SIGKILLed
// mid-stream and started again, five times, while Sangho keeps
// delivering and retrying. Nothing acknowledged is lost: a done record
// is on disk before its commit returns. The leases in flight die with
// the process, so those deliveries are retried at once after the
// restart. A double is possible only by nature: the backend was working
// on an event when Caddy died and, like most backends, finished it; or
// it had answered and Caddy died before the done record was on disk
// (the commit's fsync, under a millisecond on an idle disk, tens of
// milliseconds when the disk is busy). The test checks that every
// double is of that kind (checkDoublesAtTheKills); the count is
// reported, not bounded.
func TestDefaultStoreKilledAndRestarted(t *testing.T) {
	l := ledger.New(t)
	l.Behave(func(string, int) ledger.Action { return ledger.Action{Delay: 200 * time.Millisecond} })
	site := siteConfig("", l.Addr, "")
	p := startCaddy(t, site)
	s := newSender([]string{p.url}, 2)
	n := 200 * scale
	const nkills = 5
	var restartFailed atomic.Bool
	var kills []killSpan
	ids, acked := s.run("file_kill", n, func(prog *atomic.Int64) {
		for i := range nkills {
			at(prog, int64(2*n*(i+1)/(nkills+1)), func() {
				s.fig.faults.Add(1)
				kills = append(kills, killNow(p))
				if !p.launch(t) {
					b, _ := os.ReadFile(p.log)
					t.Errorf("restart %d: caddy exited before listening:\n%s", i+1, b)
					restartFailed.Store(true)
				}
			})
			if restartFailed.Load() {
				return
			}
		}
	})
	waitIdle(l)
	s.fig.note, _ = checkDoublesAtTheKills(t, l, s, ids, kills)
	check(t, "default (file) store: Caddy SIGKILLed and restarted 5 times", s, l, ids, acked, true)
}

// TestFileStoreOneProcessPerFile: a second `caddy run` pointed at the
// data directory of a running Caddy refuses to start, naming the file,
// and the first one keeps serving; `caddy validate` of the running
// config, in the same data directory, succeeds.
func TestFileStoreOneProcessPerFile(t *testing.T) {
	l := ledger.New(t)
	site := siteConfig("", l.Addr, "")
	first := startCaddy(t, site)
	s := newSender([]string{first.url}, 1)
	ids, acked := s.run("file_lock_before", 5, nil)

	// The second Caddy's config sits beside the first's: the folder is
	// its home and data directory too.
	dataDir := filepath.Dir(first.cfg)
	second := &caddyProc{port: netkit.FreePort(t), cfg: filepath.Join(dataDir, "Caddyfile.second"), log: filepath.Join(dataDir, "caddy.second.log")}
	if err := os.WriteFile(second.cfg, []byte(caddyfile(second.port, netkit.FreePort(t), site)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.kill)
	if second.launch(t) {
		t.Fatal("a second Caddy started on the data directory of a running one")
	}
	b, _ := os.ReadFile(second.log)
	db := filepath.Join(dataDir, "caddy", "sangho_dedup", "dedup.db")
	for _, want := range []string{db, "in use by another process"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the second Caddy's log does not say %q:\n%s", want, b)
		}
	}

	validate := exec.Command(caddyBin, "validate", "--config", first.cfg, "--adapter", "caddyfile")
	validate.Env = append(os.Environ(), "HOME="+dataDir, "XDG_DATA_HOME="+dataDir, "XDG_CONFIG_HOME="+dataDir)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = validate.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = validate.Process.Kill()
		t.Fatal("caddy validate did not finish within 60 s")
	}
	if err != nil {
		t.Errorf("caddy validate of the running config failed: %v\n%s", err, out)
	}
	// validate with no Caddy running creates nothing (the file belongs
	// to the user Caddy runs as)
	fresh := t.TempDir()
	validate = exec.Command(caddyBin, "validate", "--config", first.cfg, "--adapter", "caddyfile")
	validate.Env = append(os.Environ(), "HOME="+fresh, "XDG_DATA_HOME="+fresh, "XDG_CONFIG_HOME="+fresh)
	if out, err := validate.CombinedOutput(); err != nil {
		t.Errorf("caddy validate with no file yet: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(fresh, "caddy", "sangho_dedup")); err == nil {
		t.Error("caddy validate created the file store's folder")
	}

	ids2, acked2 := s.run("file_lock_after", 5, nil)
	for id := range acked2 {
		acked[id] = true
	}
	check(t, "default (file) store: a second process refused, validate while running", s, l, append(ids, ids2...), acked, false)
	// and the events sent before are still duplicates
	s2 := newSender([]string{first.url}, 1)
	s2.run("file_lock_before", 5, nil)
	if got := s2.fig.duplicates.Load(); got != 5 {
		t.Errorf("redeliveries after the refused second start: %d duplicates, want 5", got)
	}
}
