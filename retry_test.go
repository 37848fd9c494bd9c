package sanghodedup

import (
	"context"
	"testing"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// aliasedStore is a store whose data had another ID earlier in this
// process (dedup.DataAliaser), as a PostgreSQL pool or a Redis client
// opened while its server could not be asked has.
type aliasedStore struct {
	dedup.Store
	aliases []string
}

func (s aliasedStore) DataAliases() []string { return s.aliases }

// TestForgetStopsCommitRetriesUnderAnAlias: a commit retry registered
// by an earlier config under the ID its store had then (the DSN's,
// before the server could be asked) is stopped by a forget through a
// later config on the same pool, which names the data by the server's
// ID: else the retry writes the forgotten record back.
func TestForgetStopsCommitRetriesUnderAnAlias(t *testing.T) {
	h, _ := newTestHandler(t, nil)
	const earlier = "postgres localhost:5432 db postgres table public.events"
	h.store = aliasedStore{Store: h.store, aliases: []string{earlier}}
	key := h.KeyPrefix + "evt_alias"
	cr := commitRetries.add(earlier, key)
	defer commitRetries.remove(cr)
	if _, _, err := h.forget(context.Background(), key, false); err != nil {
		t.Fatal(err)
	}
	if stopped, _ := cr.attempt(func() error { return nil }); !stopped {
		t.Fatal("the forget did not stop the commit retry registered under the store's earlier ID")
	}
}
