// Package storepool shares store resources (a Redis client, an open
// file, the memory map, a PostgreSQL pool) across config reloads, and
// keeps them for the deliveries a cleaned-up config still has in flight.
package storepool

import (
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// Pool holds the shared resources, by key, for the whole process.
var Pool = caddy.NewUsagePool()

// Users counts the deliveries and commit retries that may still need a
// resource shared through Pool; a store embeds it to implement
// dedup.Drainer. On a reload Caddy starts the new config, then cleans
// the old one up without waiting for its requests in flight: Release
// keeps the resource until they are done, for at most dedup.DrainFor.
type Users struct{ n atomic.Int64 }

// Enter marks the resource as in use (dedup.Drainer).
func (u *Users) Enter() { u.n.Add(1) }

// Leave undoes one Enter (dedup.Drainer).
func (u *Users) Leave() { u.n.Add(-1) }

// Release gives up this config's use of the pooled resource key, at
// once if nothing uses it, else in the background once nothing does.
func (u *Users) Release(key string, logger *zap.Logger) error {
	if u.n.Load() == 0 {
		_, err := Pool.Delete(key)
		return err
	}
	go func() {
		deadline := time.Now().Add(dedup.DrainFor)
		for u.n.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := Pool.Delete(key); err != nil && logger != nil {
			logger.Error("shared store close failed", zap.String("resource", key), zap.Error(err))
		}
	}()
	return nil
}
