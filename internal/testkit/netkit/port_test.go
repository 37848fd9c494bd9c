package netkit

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// A port handed out by FreePort in one test process is not handed out
// by another while the first lives: test packages run at once, and two
// Caddys on one port (Caddy's listeners set SO_REUSEPORT, so both bind)
// would share its connections, one test's requests landing on the
// other's sites.
func TestFreePortReservedAcrossProcesses(t *testing.T) {
	if p := os.Getenv("REDISTEST_PORT_HELD"); p != "" { // the second process
		port, _ := strconv.Atoi(p)
		if Reserve(port) {
			t.Fatalf("port %d was reserved again while another test process holds it", port)
		}
		if q := FreePort(t); q == port {
			t.Fatalf("FreePort handed out port %d, held by another test process", port)
		}
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	if !Reserve(port) {
		t.Fatalf("port %d: reserved already", port)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePortReservedAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISTEST_PORT_HELD="+strconv.Itoa(port))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("second test process: %v\n%s", err, out)
	}
}

// A test that asks for two ports before it binds either gets two: the
// kernel hands a port just closed out again now and then (the review's
// case: two site blocks on one address, "ambiguous site definition").
func TestFreePortNeverTheSameTwiceInAProcess(t *testing.T) {
	seen := map[int]bool{}
	for range 3000 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort handed out port %d twice", p)
		}
		seen[p] = true
	}
}
