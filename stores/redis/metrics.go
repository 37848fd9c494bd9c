package redis

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sangho/caddy-sangho-dedup/internal/promreg"
)

// What the store's checks found: the problem label of
// caddy_sangho_dedup_redis_problems_total, one per log line
// (redis permission missing, redis may evict keys, redis has evicted keys).
const (
	redisPermissionMissing = "permission_missing"
	redisMayEvict          = "may_evict"
	redisEvictedKeys       = "evicted_keys"
)

// The store's collectors, created once per process and registered with
// the registry of every config that provisions a Redis store.
var metrics = struct {
	unreplicated  prometheus.Counter
	redisProblems *prometheus.CounterVec
	cacheOff      prometheus.Gauge
}{
	unreplicated: prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "commit_unreplicated_total",
		Help: "Done records that fewer replicas than wait_replicas acknowledged in wait_timeout.",
	}),
	redisProblems: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "redis_problems_total",
		Help: "Problems the Redis store's checks found, by problem: permission_missing, may_evict, evicted_keys.",
	}, []string{"problem"}),
	cacheOff: prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "sangho_dedup", Name: "local_cache_off",
		Help: "Redis stores with a local_cache that is not serving (tracking connection down or refused).",
	}),
}

func init() {
	for _, p := range []string{redisPermissionMissing, redisMayEvict, redisEvictedKeys} {
		metrics.redisProblems.WithLabelValues(p) // exported at 0, so that a first one is an increase
	}
}

// registerMetrics adds the store's collectors to a config's registry.
func registerMetrics(reg prometheus.Registerer) error {
	return promreg.Register(reg, metrics.unreplicated, metrics.redisProblems, metrics.cacheOff)
}

// msDuration is ms milliseconds (a time to live that Redis returned)
// as a Duration, saturated at the longest Duration, never wrapped.
func msDuration(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}
