package redis

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// identifyTimeout bounds the question identify asks at provision: Caddy
// starts while Redis is down or unreachable, at most this much later per
// client.
const identifyTimeout = 2 * time.Second

// identify names the Redis data the store reaches for the handler's
// check that two endpoints with different secrets do not share one
// store and key_prefix (dedup.DataSharer), and for the forget that
// stops commit retries. The addresses as written cannot tell it on a
// Cluster (two configs may list different, even disjoint, seed nodes of
// one Cluster) nor behind Sentinel (different Sentinels of one
// deployment), so there Redis is asked:
//   - a Cluster is named by the smallest ID of the masters CLUSTER SLOTS
//     lists (the command the store already needs): every seed of one
//     Cluster gives the same, another Cluster has other node IDs;
//   - behind Sentinel, the store is the master the Sentinels name for
//     master_name (SENTINEL GET-MASTER-ADDR-BY-NAME), with the database,
//     spelled as a standalone server's: one ID with a config that
//     addresses that master directly.
//
// When Redis cannot answer within identifyTimeout, the ID is the
// addresses' (resolvedOptions.stateID) and a warning says so. Redis's
// answer is kept for the client's life, the addresses' stands for one
// config load (storepool.DataName). A standalone server is not asked:
// its ID is its address, spelled one way.
func (rc *redisClient) identify(ctx context.Context, o resolvedOptions, logger *zap.Logger) string {
	u := o.universal
	cluster, isCluster := rc.UniversalClient.(*goredis.ClusterClient)
	if !isCluster && u.MasterName == "" {
		return o.stateID()
	}
	ask := func() (string, error) {
		qctx, cancel := context.WithTimeout(ctx, identifyTimeout)
		defer cancel()
		if isCluster {
			return clusterIdentity(qctx, cluster)
		}
		return masterIdentity(qctx, u)
	}
	return rc.name.Of(ctx.Done(), o.stateID(), ask, func(err error) {
		logger.Warn("redis identity unknown", zap.String("compared_as", o.stateID()),
			zap.String("risk", "another endpoint on this Redis through other addresses goes unnoticed until a config load (a reload) while Redis answers"),
			zap.Error(err))
	})
}

// clusterIdentity is "redis cluster" and the smallest node ID of the
// Cluster.
func clusterIdentity(ctx context.Context, c *goredis.ClusterClient) (string, error) {
	// CLUSTER SLOTS, not SHARDS: go-redis's own Cluster client loads its
	// topology with it, so the documented ACL line grants it already.
	//lint:ignore SA1019 SHARDS would need one more permission of every user
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	return clusterID(slots)
}

// clusterID names a Cluster by the smallest ID of the masters that
// CLUSTER SLOTS lists (each range's first node). Not of every node it
// lists: a node learns the replicas by gossip, so two seeds of one
// Cluster can list different replicas for a while (just after the
// Cluster formed, after a replica joined), and a smallest ID that is a
// replica's made one Cluster two stores (TestServerOneRedisTwoAddressLists
// failed that way, once in many runs). The masters are the slots'
// owners, which every node of a Cluster in service agrees on.
func clusterID(slots []goredis.ClusterSlot) (string, error) {
	var ids []string
	for _, s := range slots {
		if len(s.Nodes) > 0 && s.Nodes[0].ID != "" {
			ids = append(ids, s.Nodes[0].ID)
		}
	}
	if len(ids) == 0 {
		return "", errors.New("CLUSTER SLOTS lists no master's node ID")
	}
	return "redis cluster node " + slices.Min(ids), nil
}

// masterIdentity asks the Sentinels, in their order, for the master's
// address, and names it as a standalone server at that address.
func masterIdentity(ctx context.Context, u *goredis.UniversalOptions) (string, error) {
	var errs []error
	for _, a := range u.Addrs {
		sc := goredis.NewSentinelClient(&goredis.Options{
			Addr: a, Username: u.SentinelUsername, Password: u.SentinelPassword,
			TLSConfig: u.TLSConfig, DialTimeout: u.DialTimeout, ReadTimeout: u.ReadTimeout, WriteTimeout: u.WriteTimeout,
			MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
		addr, err := sc.GetMasterAddrByName(ctx, u.MasterName).Result()
		sc.Close()
		if err == nil && len(addr) == 2 {
			return "redis " + canonicalAddr(net.JoinHostPort(addr[0], addr[1])) + " db " + strconv.Itoa(u.DB), nil
		}
		if err == nil {
			err = errors.New("no master named " + strconv.Quote(u.MasterName))
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return "", errors.Join(errs...)
}
