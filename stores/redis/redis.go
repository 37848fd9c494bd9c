// Package redis is the sangho_dedup store on Redis: standalone, Cluster
// or Sentinel (module http.sangho_dedup.stores.redis), shared by every
// Caddy instance that reaches the same data.
package redis

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

func init() {
	caddy.RegisterModule(Store{})
	cfargs.Options(Store{}, "tls_client_auth", "pipeline")
}

// Store keeps dedup state in Redis (7.0 or later, or Valkey), so
// that it is durable (as far as Redis persists) and shared by every Caddy
// instance that points at the same Redis. Every operation touches a
// single key in one command (batched with other requests' commands into
// pipelines under load): a claim is `SET key lease NX GET PX ttl`,
// a commit `SET key record GET PX retention`, a renewal and a release
// are small Lua scripts that compare the lease token first. It works
// alike on a standalone server, a Redis Cluster and behind Sentinel.
//
// On a standalone server, done records that a claim finds are kept in
// a bounded local cache (local_cache), so that further redeliveries of
// a processed event are answered without a round trip (not on a Cluster,
// where tracking is per node, nor behind Sentinel, where go-redis's
// failover client carries every command so that a failover moves them
// all to the new master at once).
// Redis itself keeps the cache true (CLIENT TRACKING on a connection of
// its own): an entry is dropped as soon as Redis reports its key changed
// (deleted, expired, rewritten, flushed), and the whole cache is dropped
// and not used whenever that connection is down. Redis reports nothing
// for SWAPDB: after swapping the store's database, close the tracking
// connections (flag t in CLIENT LIST) or the cache keeps answering from
// the old one.
//
// Before its first claim the store checks that the Redis user may run
// every command it sends (SET, GET, PEXPIRE, PTTL, DEL, EVAL, EVALSHA, WAIT
// with wait_replicas; CLUSTER SLOTS on a Cluster): until it may, claims
// fail (the handler answers 503) and the refused command is logged at
// error level. The same check warns when Redis can evict keys
// (maxmemory-policy other than noeviction), where CONFIG GET is allowed.
//
// Clients are shared across config reloads: a reload that keeps the same
// connection settings (TLS certificates included) keeps the same
// connections.
type Store struct {
	// Addresses as host:port. One address: a standalone server. Several
	// addresses: the seed nodes of a Redis Cluster. With master_name: the
	// Sentinels. Default: 127.0.0.1:6379 when url is empty too.
	// Placeholders such as {env.REDIS_ADDR} are resolved at provision.
	Address []string `json:"address,omitempty"`

	// A redis://, rediss:// (TLS) or unix:// URL, instead of address:
	// redis[s]://[user[:password]@]host[:port][/db][?params] or
	// unix://[user[:password]@]/path/to/socket[?params]. Query
	// parameters honoured: db, dial_timeout, read_timeout,
	// write_timeout, pool_size, client_name (CLIENT SETNAME) and, with
	// rediss, skip_verify; any other is a config error, and so is a
	// setting given both in the URL and as its own option. It cannot be
	// combined with address, master_name or tls (the tls_* options work
	// with rediss://). Placeholders resolved.
	URL string `json:"url,omitempty"`

	// The name of the master monitored by the Sentinels listed in
	// address. Default: none (no Sentinel).
	MasterName string `json:"master_name,omitempty"`

	// Use the Redis Cluster client even with a single address (or a
	// URL): for a managed cluster's configuration endpoint, which is
	// one address. Without it one address is a standalone server, and
	// a Cluster node given as one answers MOVED for most keys (503).
	// Default: false (several addresses are a Cluster all the same).
	Cluster bool `json:"cluster,omitempty"`

	// ACL user name. Default: none. Placeholders resolved.
	Username string `json:"username,omitempty"`

	// Password (for Sentinel setups, of the data nodes). Default: none.
	// Use a placeholder such as {env.REDIS_PASSWORD} so that the secret
	// stays out of the adapted and autosaved JSON.
	Password string `json:"password,omitempty"`

	// Database number, standalone and Sentinel only. Default: 0.
	DB int `json:"db,omitempty"`

	// Connect with TLS (without a URL; with a URL use rediss://), and
	// verify the server against the system's trusted roots unless
	// tls_trust_pool says otherwise. Each tls_* option implies it.
	// Default: false.
	TLS bool `json:"tls,omitempty"`

	// The certificate authorities that the Redis server's certificate
	// must chain to, as one of Caddy's CA pool modules
	// (tls.ca_pool.source: file, inline, pki_root, storage, http, ...),
	// e.g. {"provider": "file", "pem_files": ["/etc/redis/ca.pem"]}.
	// Implies TLS (with a URL: it must be rediss://). Default: the
	// system's trusted roots.
	TLSTrustPoolRaw json.RawMessage `json:"tls_trust_pool,omitempty" caddy:"namespace=tls.ca_pool.source inline_key=provider"`

	// PEM file of the client certificate to present to Redis (for
	// tls-auth-clients yes), with the key file of tls_client_auth. Implies
	// TLS. Placeholders resolved. Default: none.
	TLSClientCertificateFile string `json:"tls_client_certificate_file,omitempty"`

	// PEM file of the client certificate's private key. Placeholders
	// resolved. Default: none.
	TLSClientCertificateKeyFile string `json:"tls_client_certificate_key_file,omitempty"`

	// The name the server's certificate must hold, when it is not the
	// host of the address (e.g. the address is an IP). On a Cluster
	// every node's certificate must then hold it. Implies TLS.
	// Placeholders resolved. Default: the host of each address.
	TLSServerName string `json:"tls_server_name,omitempty"`

	// Do not verify the server's certificate at all: anyone on the path
	// can then read and change the dedup state. For tests only; warned
	// at load. Implies TLS. Default: false.
	TLSInsecureSkipVerify bool `json:"tls_insecure_skip_verify,omitempty"`

	// Timeout to establish a connection. Default: 5s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// Timeout for reading a reply. Default: 3s.
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`

	// Timeout for writing a command. Default: the read timeout.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`

	// Maximum connections per node. Default: 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// Send each command on its own instead of batching the claims and
	// commits of concurrent requests into pipelines. Pipelined, on a
	// standalone server they share one connection of the store's own: a
	// command is written at once when no batch is awaiting replies (a
	// request alone waits for nothing), otherwise it joins the batch
	// written as soon as those replies are in; on a Cluster and behind
	// Sentinel, go-redis auto-pipelining batches them. Pipelining cuts
	// Caddy's and Redis's CPU per event under load. Default: false
	// (pipelining on).
	DisablePipeline bool `json:"disable_pipeline,omitempty"`

	// Replicas that must acknowledge a done record (Redis WAIT, on the
	// same connection as the write) before the commit counts as complete.
	// Redis replicates asynchronously: without it, a failover right
	// after a commit can lose the record and let a redelivery through.
	// A commit that fewer replicas acknowledge within wait_timeout is kept
	// on the master, logged and counted
	// (caddy_sangho_dedup_commit_unreplicated_total). Default: 0 (off).
	WaitReplicas int `json:"wait_replicas,omitempty"`

	// How long a commit waits for wait_replicas. Default: 100ms.
	WaitTimeout caddy.Duration `json:"wait_timeout,omitempty"`

	// How many done records to keep in memory, to answer redeliveries of
	// processed events without asking Redis; 0 or off: no cache. Opt-in:
	// it pays only where an instance sees the same event again and again
	// (under realistic redelivery, 1 to 3 redeliveries over several
	// instances, it costs more than it saves: bench/REDIS-CLIENT-AB.md),
	// and it cannot see SWAPDB.
	// Redis invalidates an entry when its key changes (server-assisted
	// client-side caching, CLIENT TRACKING; not for SWAPDB, which Redis
	// does not report), and the cache is dropped while its tracking
	// connection is down. Standalone server only: on a Cluster and
	// behind Sentinel it is off, and setting it is a config error. The
	// Redis user needs CLIENT TRACKING and PTTL besides the store's
	// commands; without them the cache stays off (logged). Default: off
	// (10000 is a good size where it pays).
	LocalCache *int `json:"local_cache,omitempty"`

	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // set on a Redis Cluster
	cmd     goredis.Cmdable        // the client, or its auto-pipeliner
	pipe    *pipe                  // claims and commits, unless nil
	cache   *doneCache             // nil when off
	tracker *tracker
	poolKey string
	state   string       // the Redis data reached, for stateID
	rc      *redisClient // the shared client (its earlier IDs: DataAliases)
	check   *permCheck
	logger  *zap.Logger
	// the read timeout in effect (from ReadTimeout or the url), once
	// provisioned
	readTimeout time.Duration

	// users counts the deliveries and commit retries that may still need
	// the shared client: its Enter and Leave implement dedup.UseCounter.
	*users
}

// users is storepool.Users under a name of this package, so that Store
// embeds it as an unexported field: its Enter and Leave are Store's
// (dedup.UseCounter).
type users = storepool.Users

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.stores.redis",
		New: func() caddy.Module { return new(Store) },
	}
}

// redisClient holds a shared client in the usage pool, with the store's
// own pipe and done-record cache on a standalone server.
type redisClient struct {
	goredis.UniversalClient
	pipe    *pipe
	cache   *doneCache
	tracker *tracker

	name storepool.DataName // the Cluster or master as Redis names it (identify)
}

func newRedisClient(o *goredis.UniversalOptions, cacheSize int, logger *zap.Logger) *redisClient {
	rc := &redisClient{UniversalClient: goredis.NewUniversalClient(o)}
	// A standalone server only. Behind Sentinel go-redis's failover
	// client moves its connections to the new master as soon as the
	// Sentinels announce it (+switch-master); a connection of the
	// store's own would stay on the old master, still a master for
	// seconds, until Sentinel demotes it and discards what it took.
	if c, ok := rc.UniversalClient.(*goredis.Client); ok && o.MasterName == "" {
		cs := settingsOf(c.Options())
		rc.pipe = newPipe(cs)
		if cacheSize > 0 {
			rc.cache = newDoneCache(cacheSize)
			rc.tracker = newTracker(cs, rc.cache, logger)
		}
	}
	return rc
}

func (c *redisClient) Destruct() error {
	if c.tracker != nil {
		c.tracker.close()
	}
	if c.pipe != nil {
		c.pipe.close()
	}
	return c.Close()
}

// Provision resolves placeholders, then takes a client with these
// settings from the usage pool or creates one. Caddy starts while
// Redis is down, and requests are answered 503 (or passed, see
// on_store_error) until Redis is back. On a Cluster or behind Sentinel
// it asks, once per client and for at most 2s, which Cluster or master
// the addresses lead to (see redisClient.identify); it does not contact
// a standalone server.
func (s *Store) Provision(ctx caddy.Context) error {
	// Caddy validates after provisioning; the client built below must
	// not see a bad value first (a negative pool_size panics go-redis).
	if err := s.validateValues(); err != nil {
		return err
	}
	s.check = newPermCheck()
	if s.logger == nil {
		s.logger = ctx.Logger()
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	opts, err := s.options(ctx)
	if err != nil {
		return err
	}
	if t := opts.universal.TLSConfig; t != nil && t.InsecureSkipVerify {
		s.logger.Warn("redis TLS certificate not verified",
			zap.String("option", "tls_insecure_skip_verify or skip_verify"),
			zap.String("risk", "anyone on the path can read and change the dedup state"))
	}
	s.poolKey = opts.poolKey()
	s.users = new(users)
	v, _, err := storepool.Pool.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		return newRedisClient(opts.universal, opts.cacheSize, s.logger), nil
	})
	if err != nil {
		return err
	}
	rc := v.(*redisClient)
	s.rc = rc
	s.state = rc.identify(ctx, opts, s.logger)
	s.client, s.cache, s.tracker = rc.UniversalClient, rc.cache, rc.tracker
	s.cluster, _ = s.client.(*goredis.ClusterClient)
	s.cmd = s.client
	if !s.DisablePipeline && rc.pipe != nil {
		s.pipe = rc.pipe
	} else if !s.DisablePipeline {
		ap, err := s.client.AutoPipeline()
		if err != nil {
			return fmt.Errorf("redis store: starting the auto-pipeliner: %v", err)
		}
		s.cmd = ap
	}
	return nil
}

// Cleanup releases this config's use of the shared client; the client
// is closed when no config uses it any more. On a reload Caddy cleans
// the old config up while its requests may still be in flight: then
// the use is released once they and their commit retries are done (at
// most dedup.DrainFor later), so that they can still commit or release.
func (s *Store) Cleanup() error {
	if s.poolKey == "" {
		return nil
	}
	return s.users.Release(s.poolKey, s.logger)
}

// holdsCredentials reports whether the address a may hold a user or a
// password: a scheme, a leading //, an @ in a host:port, or in a path's
// first folder (a socket's path may hold one further on:
// /run/user@1000/redis.sock).
func holdsCredentials(a string) bool {
	switch {
	case strings.Contains(a, "://") || strings.HasPrefix(a, "//"):
		return true
	case !strings.HasPrefix(a, "/"):
		return strings.Contains(a, "@")
	}
	first, _, _ := strings.Cut(a[1:], "/")
	return strings.Contains(first, "@")
}

// badAddress names the i-th address (0-based), which is not one, in an
// error: by its position when it holds a user or a scheme (a URL written
// where an address goes, whose password is not shown); as written when
// that was a placeholder (its value is not shown); else quoted.
func badAddress(i int, written, resolved string) string {
	switch {
	case holdsCredentials(written):
		return fmt.Sprintf("address %d (not shown: it looks like a URL, which may hold a password)", i+1)
	case written != resolved:
		return "address " + written // a placeholder, whose value is not shown
	}
	return fmt.Sprintf("address %q", resolved)
}

// resolvedOptions are the settings after placeholders, ready for go-redis.
type resolvedOptions struct {
	universal *goredis.UniversalOptions
	cacheSize int // 0: no local cache
	// normalized settings, the key of the usage pool
	norm map[string]any
}

func (o resolvedOptions) poolKey() string {
	b, _ := json.Marshal(o.norm)
	sum := sha256.Sum256(b) // the password is part of it: keep the key opaque
	return "sangho_dedup.goredis." + hex.EncodeToString(sum[:])
}

// stateID names the Redis data these options reach as the addresses
// tell (redisClient.identify asks a Cluster or the Sentinels instead
// when it can): the servers (or Sentinels and master name) and the
// database, whatever the other
// settings and however they are given (address or url, db in the url or
// as an option), each address spelled one way by canonicalAddr.
// Two stores with the same ID share their keys: the handler refuses two
// endpoints with different secrets on one ID and key_prefix, and a
// forget stops the commit retries of its key on that ID.
func (o resolvedOptions) stateID() string {
	addrs := make([]string, 0, len(o.universal.Addrs))
	for _, a := range o.universal.Addrs {
		addrs = append(addrs, canonicalAddr(a))
	}
	slices.Sort(addrs)
	id := "redis " + strings.Join(slices.Compact(addrs), ",")
	if m := o.universal.MasterName; m != "" {
		id += " master " + m
	}
	return id + " db " + strconv.Itoa(o.universal.DB)
}

// canonicalAddr spells an address one way without resolving it
// (what a name resolves to can change; a standalone server is not
// asked, see redisClient.identify): the host name in lower case
// without a trailing dot, an IP address in its canonical form, the
// port as a plain number, and
// localhost, 127.0.0.1 and ::1 as one (RFC 6761 localhost; Redis listens
// on both loopback addresses by default, bind 127.0.0.1 -::1). A unix
// socket's path is cleaned. One server reached by two different names
// (a DNS name and its IP) still counts as two: docs/redis.md says so.
func canonicalAddr(a string) string {
	if strings.HasPrefix(a, "/") {
		return filepath.Clean(a)
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return a
	}
	if p, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(p, 10)
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	if host == "127.0.0.1" || host == "::1" {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// options resolves placeholders and builds the effective go-redis
// options, and the key of the shared client: every setting that makes
// two clients differ, TLS included.
func (s *Store) options(ctx caddy.Context) (resolvedOptions, error) {
	repl := caddy.NewReplacer()
	var unresolved error // the first placeholder left unresolved
	resolve := func(option, v string) string {
		out, err := cfargs.Resolve(repl, option, v)
		if unresolved == nil {
			unresolved = err
		}
		return out
	}
	fail := func(err error) (resolvedOptions, error) {
		return resolvedOptions{}, fmt.Errorf("redis store: %w", err)
	}

	var addrs, written []string // written: each address as the config has it
	for _, a := range s.Address {
		if r := resolve("address", a); r != "" {
			addrs, written = append(addrs, r), append(written, a)
		}
	}
	u := resolve("url", s.URL)
	o := &goredis.UniversalOptions{
		Addrs:                 addrs,
		MasterName:            resolve("master_name", s.MasterName),
		Username:              resolve("username", s.Username),
		Password:              resolve("password", s.Password),
		DB:                    s.DB,
		DialTimeout:           time.Duration(s.DialTimeout),
		ReadTimeout:           time.Duration(s.ReadTimeout),
		WriteTimeout:          time.Duration(s.WriteTimeout),
		PoolSize:              s.PoolSize,
		IsClusterMode:         s.Cluster,
		ContextTimeoutEnabled: true,
		// Fail fast when Redis is down: a delivery is answered 503 (and
		// retried by Sangho) within a few milliseconds instead of holding
		// its connection through go-redis's default 4 attempts of 5 dials
		// each. One retry remains, for a pooled connection that died
		// (e.g. after a Redis restart).
		MaxRetries:    1,
		DialerRetries: 1,
		// No CLIENT SETINFO on each new connection: the ACL of the README
		// does not grant it (Redis 7.0 lacks it, so it cannot be granted
		// everywhere), and a refused one fills Redis's ACL LOG.
		DisableIdentity: true,
	}
	if unresolved != nil {
		return fail(unresolved)
	}
	for i, a := range addrs {
		// go-redis would only fail at the first dial, as a store error.
		// A path is a Unix socket (go-redis dials it so). Credentials in
		// an address (user:pass@host:port has a host:port's shape, and
		// /user:pass@host a path's) would reach every store error and
		// go-redis's log: refused, not shown. A socket's path may hold an
		// @ past its first segment (/run/user@1000/redis.sock).
		credentials := holdsCredentials(a)
		if !credentials && strings.HasPrefix(a, "/") {
			continue
		}
		if _, port, err := net.SplitHostPort(a); credentials || err != nil || !validPort(port) {
			return fail(fmt.Errorf("%s: write host:port (a Redis server, a Cluster node or a Sentinel) or a Unix socket's path, or use url (a user and a password go in username and password)", badAddress(i, written[i], a)))
		}
	}
	wantTLS, skipVerify := s.TLS, false
	if u != "" {
		if len(addrs) > 0 || o.MasterName != "" || s.TLS {
			return fail(errors.New("url cannot be combined with address, master_name or tls"))
		}
		r, err := parseRedisURL(u)
		if err != nil {
			return fail(err)
		}
		if err := r.apply(o); err != nil {
			return fail(err)
		}
		if r.scheme == "unix" && s.Cluster {
			return fail(errors.New("cluster cannot be used with a unix:// url"))
		}
		if names := s.tlsOptions(); r.scheme != "rediss" && len(names) > 0 {
			return fail(fmt.Errorf("%s needs TLS: use a rediss:// url", names[0]))
		}
		wantTLS, skipVerify = r.scheme == "rediss", r.skipVerify
	}
	if len(o.Addrs) == 0 {
		o.Addrs = []string{"127.0.0.1:6379"}
	}
	var tlsID map[string]any
	if wantTLS || len(s.tlsOptions()) > 0 {
		cfg, id, err := s.tlsConfig(ctx, resolve, skipVerify)
		if unresolved != nil { // the cause of tlsConfig's error, if any
			err = unresolved
		}
		if err != nil {
			return fail(err)
		}
		o.TLSConfig, tlsID = cfg, id
	}
	if s.Cluster && o.MasterName != "" {
		return fail(errors.New("cluster cannot be combined with master_name"))
	}
	if (len(o.Addrs) > 1 || s.Cluster) && o.MasterName == "" && o.DB != 0 {
		return fail(errors.New("db must be 0 on a Redis Cluster (several addresses, or cluster)"))
	}
	for _, d := range []struct {
		option string
		value  time.Duration
	}{{"dial_timeout", o.DialTimeout}, {"read_timeout", o.ReadTimeout}, {"write_timeout", o.WriteTimeout}, {"wait_timeout", time.Duration(s.WaitTimeout)}} {
		if err := cfargs.Bounds(d.option, d.value, 0, MaxTimeout); err != nil {
			return fail(err)
		}
	}
	s.readTimeout = o.ReadTimeout
	if s.readTimeout == 0 {
		s.readTimeout = 3 * time.Second
	}
	if s.WaitReplicas > 0 && s.effectiveWaitTimeout() >= s.readTimeout {
		return fail(fmt.Errorf("wait_timeout must be shorter than read_timeout, or the WAIT reply times out: %v against %v (wait_timeout is 100ms when not set, read_timeout 3s)", s.effectiveWaitTimeout(), s.readTimeout))
	}
	cacheSize := 0
	if s.LocalCache != nil {
		cacheSize = *s.LocalCache
	}
	if len(o.Addrs) > 1 || s.Cluster || o.MasterName != "" {
		// On a Cluster tracking would be per node; behind Sentinel the
		// tracking connection would stay on a demoted master.
		if s.LocalCache != nil && *s.LocalCache > 0 {
			return fail(errors.New("local_cache works with a standalone server only, not a Redis Cluster or Sentinel: remove it or set it to off"))
		}
		cacheSize = 0
	}
	norm := map[string]any{
		"addrs": o.Addrs, "master": o.MasterName, "user": o.Username, "pass": o.Password,
		"db": o.DB, "dial": o.DialTimeout, "read": o.ReadTimeout, "write": o.WriteTimeout,
		"pool": o.PoolSize, "cluster": o.IsClusterMode, "client_name": o.ClientName, "tls": tlsID,
		"local_cache": cacheSize,
	}
	return resolvedOptions{universal: o, norm: norm, cacheSize: cacheSize}, nil
}

// MaxTimeout bounds dial_timeout, read_timeout, write_timeout and
// wait_timeout (in their options and in a url): a request waits for
// Redis at most that long, and the deadlines built from them never wrap.
const MaxTimeout = time.Hour

// Validate checks values that need no placeholder resolution, and
// wait_timeout against the read timeout (a url's, once provisioned).
func (s *Store) Validate() error {
	if err := s.validateValues(); err != nil {
		return err
	}
	if s.WaitReplicas > 0 && s.effectiveWaitTimeout() >= time.Duration(s.effectiveReadTimeout()) {
		return fmt.Errorf("redis store: wait_timeout must be shorter than read_timeout, or the WAIT reply times out: %v against %v (wait_timeout is 100ms when not set, read_timeout 3s)",
			s.effectiveWaitTimeout(), time.Duration(s.effectiveReadTimeout()))
	}
	return nil
}

// validateValues checks each value on its own.
func (s *Store) validateValues() error {
	switch {
	case s.DB < 0:
		return errors.New("redis store: db must not be negative")
	case s.PoolSize < 0 || s.PoolSize > MaxPoolSize:
		return fmt.Errorf("redis store: pool_size must be 1 to %d (0: the default), not %d", MaxPoolSize, s.PoolSize)
	case s.WaitReplicas < 0 || s.WaitTimeout < 0:
		return errors.New("redis store: wait_replicas and wait_timeout must not be negative")
	case s.DialTimeout < 0 || s.ReadTimeout < 0 || s.WriteTimeout < 0:
		return errors.New("redis store: timeouts must not be negative")
	case s.LocalCache != nil && *s.LocalCache < 0:
		return errors.New("redis store: local_cache must not be negative (0 or off: no cache)")
	}
	return nil
}

// MaxPoolSize bounds pool_size (as an option and in a url): go-redis
// allocates per connection of the pool before it opens any, and a pool
// of 10^8 took the process down.
const MaxPoolSize = 10_000

// defaultWaitTimeout is how long a commit waits for wait_replicas
// without wait_timeout.
const defaultWaitTimeout = 100 * time.Millisecond

// effectiveWaitTimeout is wait_timeout, or its default.
func (s *Store) effectiveWaitTimeout() time.Duration {
	if s.WaitTimeout > 0 {
		return time.Duration(s.WaitTimeout)
	}
	return defaultWaitTimeout
}

func (s *Store) effectiveReadTimeout() caddy.Duration {
	if s.readTimeout > 0 { // provisioned: the url's read_timeout counts
		return caddy.Duration(s.readTimeout)
	}
	if s.ReadTimeout > 0 {
		return s.ReadTimeout
	}
	return caddy.Duration(3 * time.Second)
}

// UnmarshalJSON decodes the JSON config as Caddy does, a bad duration
// answered with its key (cfargs.DecodeJSON).
func (s *Store) UnmarshalJSON(b []byte) error {
	type plain Store // without this method
	return cfargs.DecodeJSON(b, (*plain)(s))
}

// Interface guards
var (
	_ dedup.Store           = (*Store)(nil)
	_ dedup.UseCounter      = (*Store)(nil)
	_ dedup.DataSharer      = (*Store)(nil)
	_ caddy.Provisioner     = (*Store)(nil)
	_ caddy.Validator       = (*Store)(nil)
	_ caddy.CleanerUpper    = (*Store)(nil)
	_ caddyfile.Unmarshaler = (*Store)(nil)
)

// DataID implements dedup.DataSharer: the Redis data this store
// reaches, as Provision settled it (see resolvedOptions.stateID).
func (s *Store) DataID() string { return s.state }

// DataAliases implements dedup.DataAliaser: the addresses' ID, if an
// earlier config on this client was provisioned while Redis could not
// be asked (see redisClient.identify).
func (s *Store) DataAliases() []string {
	if s.rc == nil {
		return nil
	}
	return s.rc.name.Aliases()
}

// validPort reports whether p is a TCP port number, 1 to 65535.
func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}
