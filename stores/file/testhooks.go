package file

import (
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testhooks"
)

// The hooks the handler's tests use to stall this store's disk.
func init() {
	testhooks.FileWriteTimeout = func(d time.Duration) func() {
		old := fileWriteTimeout
		fileWriteTimeout = d
		return func() { fileWriteTimeout = old }
	}
	testhooks.FileStall = func(s dedup.Store) (<-chan struct{}, func()) {
		stalled, release := make(chan struct{}), make(chan struct{})
		go s.(*Store).state.write(func(*fileTx) error { close(stalled); <-release; return nil })
		return stalled, func() { close(release) }
	}
	testhooks.FileCounts = func(s dedup.Store) (int64, int64) {
		st := s.(*Store).state
		return st.txns.Load(), st.writes.Load()
	}
	testhooks.FileSync = func(s dedup.Store) error {
		return s.(*Store).state.write(func(*fileTx) error { return nil })
	}
	testhooks.FileLease = func(s dedup.Store, key string) (dedup.Entry, bool) {
		return s.(*Store).state.leases.Lookup(key)
	}
}
