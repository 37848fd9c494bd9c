package sanghodedup

import (
	"testing"

	"github.com/sangho/caddy-sangho-dedup/internal/redistest"
)

// startRedis starts a real redis-server on a free loopback port for one
// test (stopped at cleanup), or fails the test if there is none.
func startRedis(t testing.TB) *redistest.Server { return redistest.Start(t) }

func freePort(t testing.TB) int { return redistest.FreePort(t) }
