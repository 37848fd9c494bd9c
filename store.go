package sanghodedup

import (
	"crypto/rand"
	"encoding/hex"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
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
// (dedup.Drainer), so that a reload keeps it for them.
func (h *Handler) enter() {
	if u, ok := h.store.(dedup.Drainer); ok {
		u.Enter()
	}
}

func (h *Handler) leave() {
	if u, ok := h.store.(dedup.Drainer); ok {
		u.Leave()
	}
}

// exitParkers holds, by type, a store of each type this process loaded
// that has something to do at exit (dedup.ExitParker): ParkAtExit acts
// on every resource of its type still open, so one of each type is
// enough, and the set stays bounded however many reloads there are.
var exitParkers = struct {
	sync.Mutex
	m map[reflect.Type]dedup.ExitParker
}{m: map[reflect.Type]dedup.ExitParker{}}

func noteExitParker(s dedup.Store) {
	if p, ok := s.(dedup.ExitParker); ok {
		exitParkers.Lock()
		exitParkers.m[reflect.TypeOf(p)] = p
		exitParkers.Unlock()
	}
}

// parkAtExit runs every ExitParker, once the commit retries are done.
func parkAtExit() {
	exitParkers.Lock()
	ps := slices.Collect(maps.Values(exitParkers.m))
	exitParkers.Unlock()
	for _, p := range ps {
		p.ParkAtExit()
	}
}
