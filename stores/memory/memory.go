// Package memory is the sangho_dedup store that keeps events in this
// process's memory (module http.sangho_dedup.stores.memory).
package memory

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
	"github.com/sangho/caddy-sangho-dedup/internal/memtable"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

func init() {
	caddy.RegisterModule(Store{})
}

// Store keeps dedup state in this process's memory. It is atomic
// and fast, and it survives config reloads, but it is neither durable
// (a restart forgets every processed event) nor shared between Caddy
// instances: use it for development and single-instance setups only.
//
// A lease whose time ran out is kept for dedup.MarkFor as the mark of an
// attempt whose fate is unknown (a claim over it is dedup.Reclaimed; Get
// says "unknown"); a release leaves none, a commit replaces it. Entries
// past their time (marks past MarkFor) are swept once a minute.
type Store struct {
	state *memtable.Table
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.stores.memory",
		New: func() caddy.Module { return new(Store) },
	}
}

// memPoolKey is the key of the process-wide memory state in the usage
// pool: every memory store of every config shares it, so a reload keeps
// the processed IDs (routes keep apart by key_prefix).
const memPoolKey = "sangho_dedup.memory"

// Provision attaches the store to the process-wide memory state.
func (m *Store) Provision(ctx caddy.Context) error {
	// Not durable (a restart forgets processed events), not shared
	// between Caddy instances: for tests and trials only.
	ctx.Logger().Warn("memory store is neither durable nor shared")
	v, _, err := storepool.Pool.LoadOrNew(memPoolKey, func() (caddy.Destructor, error) {
		return memtable.New(time.Now, time.Minute), nil
	})
	if err != nil {
		return err
	}
	m.state = v.(*memtable.Table)
	return nil
}

// Cleanup releases this config's use of the memory state; the sweeper
// stops when no config uses it any more.
func (m *Store) Cleanup() error {
	if m.state == nil {
		return nil
	}
	_, err := storepool.Pool.Delete(memPoolKey)
	return err
}

// UnmarshalCaddyfile accepts `store memory` with no arguments or block.
func (m *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store type
	if err := cfargs.NoValue(d, "", "it takes no options"); err != nil {
		return err
	}
	return cfargs.NoBlock(d)
}

// Claim implements dedup.Store.
func (m *Store) Claim(_ context.Context, key, token string, ttl time.Duration) (dedup.ClaimResult, string, error) {
	return m.state.Claim(key, token, ttl)
}

// Renew implements dedup.Store.
func (m *Store) Renew(_ context.Context, key, token string, ttl time.Duration) (bool, error) {
	return m.state.Renew(key, token, ttl)
}

// Commit implements dedup.Store.
func (m *Store) Commit(_ context.Context, key, token string, rec dedup.DoneRecord, retention time.Duration) (bool, error) {
	return m.state.Commit(key, token, rec.Encode(), retention), nil
}

// Release implements dedup.Store.
func (m *Store) Release(_ context.Context, key, token string) (bool, error) {
	return m.state.Release(key, token)
}

// Get implements dedup.Store.
func (m *Store) Get(_ context.Context, key string) (dedup.Entry, error) {
	e, _ := m.state.Lookup(key)
	return e, nil
}

// Forget implements dedup.Store.
func (m *Store) Forget(_ context.Context, key string, force bool) (dedup.Entry, bool, error) {
	return m.state.Forget(key, force)
}

// Interface guards
var (
	_ dedup.Store           = (*Store)(nil)
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddy.CleanerUpper    = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
	_ dedup.DataSharer      = (*Store)(nil)
)

// DataID implements dedup.DataSharer: every memory store of this process shares one state.
func (m *Store) DataID() string { return "memory" }
