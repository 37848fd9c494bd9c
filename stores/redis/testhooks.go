package redis

import (
	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/testhooks"
)

// The hook the handler's tests use to skip the permission check's
// back-off.
func init() {
	testhooks.RedisRecheckNow = func(s dedup.Store) {
		st := s.(*Store)
		st.check.mu.Lock()
		st.check.retryEvery = 0
		st.check.mu.Unlock()
	}
}
