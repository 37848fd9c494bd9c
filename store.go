package sanghodedup

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Lease tokens: a random per-process prefix and a counter, unique across
// instances and cheaper than reading crypto/rand on every request.
var (
	tokenPrefix = func() string {
		var b [12]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic("sangho_dedup: reading random token prefix: " + err.Error())
		}
		return hex.EncodeToString(b[:]) + "-"
	}()
	tokenCounter atomic.Uint64
)

func newToken() string {
	return tokenPrefix + strconv.FormatUint(tokenCounter.Add(1), 36)
}

// enter marks h's store as in use by a delivery or a commit retry
// (dedup.UseCounter), so that a reload keeps it for them.
func (h *Handler) enter() {
	if u, ok := h.store.(dedup.UseCounter); ok {
		u.Enter()
	}
}

func (h *Handler) leave() {
	if u, ok := h.store.(dedup.UseCounter); ok {
		u.Leave()
	}
}
