package storepool

import (
	"slices"
	"sync"
)

// DataName names the data a shared resource (a connection pool, a
// client) reaches, for dedup.DataSharer and dedup.DataAliaser, where
// only its server can tell (the table a DSN reaches, the Cluster some
// seed nodes belong to).
//
// The server's answer is kept for the resource's life: every config on
// it (a reload that keeps it, two routes with the same settings) gets
// the same ID, so that commit retries registered under it are stopped
// by a forget through any of them. When the server cannot answer, the
// fallback (the resource's settings, spelled one way) stands for the
// config being loaded only, whose other stores on the resource do not
// ask again; the next load asks again, so that a resource opened while
// its server was down is named as one opened since would be. The
// fallback is then an alias (Aliases), and a forget stops the commit
// retries registered under it too.
type DataName struct {
	mu        sync.Mutex
	asked     string          // the server's answer, once had
	unknownIn <-chan struct{} // the config load in which the server could not answer
	aliases   []string
}

// Of returns the ID for the config load whose context's Done is load:
// the server's, from ask, or fallback when ask fails (failed is then
// told why, once per load).
func (n *DataName) Of(load <-chan struct{}, fallback string, ask func() (string, error), failed func(error)) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.asked != "" {
		return n.asked
	}
	if n.unknownIn != nil && n.unknownIn == load {
		return fallback
	}
	id, err := ask()
	if err != nil {
		n.unknownIn = load
		failed(err)
		return fallback
	}
	if n.unknownIn != nil {
		n.aliases = append(n.aliases, fallback)
	}
	n.asked = id
	return id
}

// Aliases returns the fallback, if a load named the data by it before
// the server's answer (dedup.DataAliaser).
func (n *DataName) Aliases() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.aliases)
}
