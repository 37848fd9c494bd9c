package netkit

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// FreePort returns a port that was free on 127.0.0.1 a moment ago and
// that no other test process on this machine, and no earlier call in
// this one, has been handed (see Reserve): the test packages run at
// once, and two of them given one port would each start a server on
// it. Two Caddys both bind it, since Caddy's listeners set SO_REUSEPORT,
// and share its connections. And the kernel hands a port just closed
// out again now and then (1 call in 1000 in a row, measured on Linux
// 6.18): a test that asked for two ports before binding either got one
// port twice.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if handedOut(port) {
			continue
		}
		if Reserve(port) {
			return port
		}
	}
	t.Fatal("finding a free port: 100 ports in a row were held by other test processes")
	return 0
}

// handed are the ports FreePort returned in this process.
var handed struct {
	sync.Mutex
	m map[int]bool
}

// handedOut reports whether port was handed out in this process before,
// and marks it handed out.
func handedOut(port int) bool {
	handed.Lock()
	defer handed.Unlock()
	if handed.m == nil {
		handed.m = map[int]bool{}
	}
	if handed.m[port] {
		return true
	}
	handed.m[port] = true
	return false
}

// portLocks is one lock file shared by the test processes of the
// machine; a port is reserved by a write lock on its byte. The file stays
// open for the life of the process, which holds its locks until it exits:
// closing any descriptor of the file would drop them all.
var portLocks struct {
	once sync.Once
	f    *os.File
}

// Reserve claims port for this process among the test processes of the
// machine, for as long as it lives. Within one process the lock is the
// process's own, so a port freed and handed out again is fine. Without a
// lock file (an unwritable temporary folder) every port is granted, as
// before there were reservations.
func Reserve(port int) bool {
	portLocks.once.Do(func() {
		f, err := os.OpenFile(filepath.Join(os.TempDir(), "sangho-dedup-test-ports.lock"), os.O_CREATE|os.O_RDWR, 0o666)
		if err == nil {
			_ = f.Chmod(0o666) // past the umask: test processes of other users share it too
			portLocks.f = f
		}
	})
	if portLocks.f == nil {
		return true
	}
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart, Start: int64(port), Len: 1}
	return syscall.FcntlFlock(portLocks.f.Fd(), syscall.F_SETLK, &lk) == nil
}
