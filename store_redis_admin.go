package sanghodedup

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// The operators' look-up and forget (admin API), each one script on the
// event's key: atomic, and on a Cluster sent to the key's master.
var (
	//go:embed lua/get.lua
	getLua string
	//go:embed lua/forget.lua
	forgetLua string

	getScript    = redis.NewScript(getLua)
	forgetScript = redis.NewScript(forgetLua)
)

// Get implements Store.
func (s *RedisStore) Get(ctx context.Context, key string) (Entry, error) {
	res, err := getScript.Run(ctx, s.client, []string{key}).Slice()
	if errors.Is(err, redis.Nil) {
		return Entry{}, nil
	}
	if err != nil {
		return Entry{}, s.failed(err)
	}
	return redisEntry(res)
}

// Forget implements Store.
func (s *RedisStore) Forget(ctx context.Context, key string, force bool) (Entry, bool, error) {
	f := "0"
	if force {
		f = "1"
	}
	res, err := forgetScript.Run(ctx, s.client, []string{key}, f).Slice()
	if s.cache != nil {
		// Redis's invalidation comes back on the tracking connection a
		// moment later: the next delivery must not wait for it.
		s.cache.forget(key)
	}
	if errors.Is(err, redis.Nil) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, s.failed(err)
	}
	e, err := redisEntry(res)
	if err != nil {
		return Entry{}, false, err
	}
	deleted, _ := res[2].(int64)
	return e, deleted == 1, nil
}

// redisEntry reads {value, pttl, ...} from a script's reply.
func redisEntry(res []any) (Entry, error) {
	if len(res) < 2 {
		return Entry{}, fmt.Errorf("redis store: unexpected script reply %v", res)
	}
	val, _ := res[0].(string)
	ttl, _ := res[1].(int64)
	e := Entry{Value: val}
	if ttl > 0 {
		e.ExpiresAt = time.Now().Add(msDuration(ttl))
	}
	return e, nil
}
