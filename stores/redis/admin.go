package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// The operators' look-up and forget (admin API), each one script on the
// event's key: atomic, and on a Cluster sent to the key's master.
var (
	//go:embed lua/get.lua
	getLua string
	//go:embed lua/forget.lua
	forgetLua string

	getScript    = goredis.NewScript(getLua)
	forgetScript = goredis.NewScript(forgetLua)
)

// Get implements Store.
func (s *Store) Get(ctx context.Context, key string) (dedup.Entry, error) {
	res, err := getScript.Run(ctx, s.client, []string{key}).Slice()
	if errors.Is(err, goredis.Nil) {
		return dedup.Entry{}, nil
	}
	if err != nil {
		return dedup.Entry{}, s.failed(err)
	}
	return redisEntry(res)
}

// Forget implements Store.
func (s *Store) Forget(ctx context.Context, key string, force bool) (dedup.Entry, bool, error) {
	f := "0"
	if force {
		f = "1"
	}
	res, err := forgetScript.Run(ctx, s.client, []string{key}, f).Slice()
	if s.cache != nil {
		// Redis's invalidation comes back on the tracking connection a
		// moment later: the next delivery must not wait for it.
		s.cache.Invalidate(key)
	}
	if errors.Is(err, goredis.Nil) {
		return dedup.Entry{}, false, nil
	}
	if err != nil {
		return dedup.Entry{}, false, s.failed(err)
	}
	e, err := redisEntry(res)
	if err != nil {
		return dedup.Entry{}, false, err
	}
	deleted, _ := res[2].(int64)
	return e, deleted == 1, nil
}

// redisEntry reads {value, pttl, ...} from a script's reply.
func redisEntry(res []any) (dedup.Entry, error) {
	if len(res) < 2 {
		return dedup.Entry{}, fmt.Errorf("redis store: unexpected script reply %v", res)
	}
	val, _ := res[0].(string)
	ttl, _ := res[1].(int64)
	lease, mark, marked := splitMark(val)
	if marked {
		// the lease's own expiry: in the past for a mark (state unknown)
		val, ttl = lease, ttl-mark.Milliseconds()
	}
	e := dedup.Entry{Value: val, Mark: marked && ttl <= 0}
	if ttl > 0 || marked {
		e.ExpiresAt = time.Now().Add(msDuration(ttl))
	}
	return e, nil
}
