// Package postgres is the sangho_dedup store that keeps events in a
// PostgreSQL table (module http.sangho_dedup.stores.postgres), the
// processed-events table of Sangho's guide: one row per event, its ID
// (with the endpoint's key_prefix) as the primary key, processed_at,
// event_type and the body's fingerprint, so that an application can see
// in its own database which events were processed and when.
package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
	"github.com/sangho/caddy-sangho-dedup/internal/storepool"
)

func init() {
	caddy.RegisterModule(Store{})
	cfargs.Options(Store{})
}

// Defaults.
const (
	DefaultTable            = "processed_webhook_events"
	DefaultStatementTimeout = 5 * time.Second
	DefaultCleanupInterval  = time.Minute
	minStatementTimeout     = time.Millisecond
	// MaxStatementTimeout bounds statement_timeout as Redis's timeouts
	// are: a store that waits longer holds deliveries, not answers them
	// (PostgreSQL refuses over 2^31-1 ms at every connection).
	MaxStatementTimeout = time.Hour
	minCleanupInterval  = 10 * time.Millisecond
	maxMaxConns         = 10000
)

// Store keeps dedup state in a PostgreSQL table, shared by every Caddy
// instance that uses the same table. A claim is the seed's own INSERT …
// ON CONFLICT DO NOTHING (one round trip) when the key has no row;
// otherwise a second statement takes an expired row and returns the row
// it found. A commit is one UPDATE of the token's live lease, and writes
// the record over whatever the key holds in a second statement when that
// updates nothing; renew and release are one statement each and check
// the lease token. Claims' inserts and held leases' commits that wait at
// the same moment go to the server as one pipeline, one transaction
// (group commit, group.go), each answered once it committed.
// A done record is as durable as the server's commit
// (synchronous_commit).
//
// Caddy starts while PostgreSQL is down, and deliveries are answered as
// on_store_error says until it is back. Provision asks the server once
// per pool, for at most 2s, which table the DSN reaches (its system
// identifier and database), so that two endpoints on one table are
// told apart by the handler however their DSNs are spelled.
// On first use the store checks that the table exists (creating it
// unless create_table is off) and that the role holds SELECT, INSERT,
// UPDATE and DELETE on it; a missing one is logged by name ("postgres
// permission missing") and every delivery fails with a store error,
// checked again at most once a second until it is granted.
//
// Expired rows are invisible to the store at once and deleted in the
// background, in batches of 32 blocks of the table, by one Caddy instance at a time
// (pg_try_advisory_xact_lock in each batch's statement).
type Store struct {
	// DSN is the connection string, a postgres:// URL or key=value
	// pairs as libpq takes them (sslmode, sslrootcert, sslcert and sslkey
	// for TLS). Placeholders such as {env.PGPASSWORD} or {file./path}
	// are resolved at provisioning, so the password stays out of the
	// adapted JSON; it is never logged. Default: libpq's defaults and
	// PG* environment variables.
	DSN string `json:"dsn,omitempty"`

	// Table is the table of processed events, optionally
	// schema-qualified (schema.table), as an unquoted SQL identifier.
	// Default: processed_webhook_events.
	Table string `json:"table,omitempty"`

	// MaxConns is the most connections the store opens; at most half of
	// them (at least one) carry groups of inserts and commits at once
	// (group.go). Default: pgxpool's, the greater of 4 and the number of
	// CPUs.
	MaxConns int `json:"max_conns,omitempty"`

	// CreateTable creates the table and its index on first use if it is
	// missing. Turn it off for a role without the CREATE privilege on
	// the schema; the table must then exist. Default: on.
	CreateTable *bool `json:"create_table,omitempty"`

	// StatementTimeout bounds each statement, on the server
	// (statement_timeout) and in Caddy, connecting included, so that a
	// stalled server or network answers a store error instead of
	// holding deliveries. Default: 5s.
	StatementTimeout caddy.Duration `json:"statement_timeout,omitempty"`

	// CleanupInterval is how often expired rows are deleted. Default: 1m.
	CleanupInterval caddy.Duration `json:"cleanup_interval,omitempty"`

	// LocalCache keeps up to this many done records in Caddy's memory,
	// so that a redelivery of a processed event is answered without a
	// statement. A forget through any instance on the table (caddy
	// sangho-dedup forget, the admin API) notifies every other one
	// (pg_notify on a channel of the table; each instance LISTENs on
	// its own connection, and the cache is emptied and not served while
	// that connection is down or silent for 3s). It cannot see rows
	// deleted or changed by other means (SQL by hand, a restored
	// backup): after one, run SELECT pg_notify(channel, '*') as
	// docs/postgres.md shows, or restart Caddy. Default: off.
	LocalCache int `json:"local_cache,omitempty"`

	db      *sharedDB
	poolKey string
	state   string
	logger  *zap.Logger

	// users counts the deliveries and commit retries that may still need
	// the shared pool: its Enter and Leave implement dedup.UseCounter.
	*users
}

// users is storepool.Users under a name of this package, so that Store
// embeds it as an unexported field: its Enter and Leave are Store's
// (dedup.UseCounter).
type users = storepool.Users

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.sangho_dedup.stores.postgres",
		New: func() caddy.Module { return new(Store) },
	}
}

// Provision resolves placeholders, validates the options and takes a
// pool with these settings from the shared pool, or creates one.
func (s *Store) Provision(ctx caddy.Context) error {
	if s.logger == nil { // a test's
		s.logger = ctx.Logger()
	}
	s.users = new(users)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("postgres store: metrics: %w", err)
	}
	o, err := s.resolve()
	if err != nil {
		return err
	}
	s.poolKey = o.poolKey()
	v, _, err := storepool.Pool.LoadOrNew(s.poolKey, func() (caddy.Destructor, error) {
		return newSharedDB(o, s.logger)
	})
	if err != nil {
		return o.scrub(fmt.Errorf("postgres store: %w", err))
	}
	s.db = v.(*sharedDB)
	s.state = s.db.identify(ctx, s.logger)
	return nil
}

// Cleanup releases this config's use of the shared pool; it is closed
// once no config and no delivery in flight uses it.
func (s *Store) Cleanup() error {
	if s.poolKey == "" {
		return nil
	}
	return s.users.Release(s.poolKey, s.logger)
}

// DataID implements dedup.DataSharer: the table as the server names
// it (see sharedDB.identify), so two endpoints on one table need
// distinct key_prefix values however their DSNs are spelled.
func (s *Store) DataID() string { return s.state }

// DataAliases implements dedup.DataAliaser: the DSN's ID, if an earlier
// config on this pool was provisioned while the server could not be
// asked (see sharedDB.identify).
func (s *Store) DataAliases() []string { return s.db.name.Aliases() }

// options are the settings after placeholders and defaults.
type options struct {
	config   *pgxpool.Config
	password string // to scrub from errors
	schema   string // "public" when the table is not qualified
	table    string
	create   bool
	timeout  time.Duration
	cleanup  time.Duration
	cache    int // local_cache entries, 0: off
	norm     map[string]any
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// parseTable validates name as table or schema.table (unquoted
// identifiers, folded to lower case as PostgreSQL folds them).
func parseTable(name string) (schema, table string, err error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", "", fmt.Errorf("table: %q is not a table name or schema.table", name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return "", "", fmt.Errorf("table: %q is not an SQL identifier (letters, digits, _ and $, at most 63, not starting with a digit)", name)
		}
	}
	if len(parts) == 2 {
		return strings.ToLower(parts[0]), strings.ToLower(parts[1]), nil
	}
	return "", strings.ToLower(parts[0]), nil
}

// resolve turns the JSON options into options: placeholders resolved,
// defaults applied, values checked (errors name the option, never the
// password).
func (s *Store) resolve() (*options, error) {
	fail := func(err error) (*options, error) { return nil, fmt.Errorf("postgres store: %w", err) }
	o := &options{create: s.CreateTable == nil || *s.CreateTable}
	table := s.Table
	if table == "" {
		table = DefaultTable
	}
	var err error
	if o.schema, o.table, err = parseTable(table); err != nil {
		return fail(err)
	}
	if o.schema == "" {
		// An unqualified table is public's, whatever the connection's
		// search_path: every spelling of one table is then one SQL name,
		// one state ID and one forget channel for the local cache.
		o.schema = "public"
	}
	if s.LocalCache < 0 {
		return fail(fmt.Errorf("local_cache: %d is negative (0: off)", s.LocalCache))
	}
	o.cache = s.LocalCache
	if s.MaxConns < 0 || s.MaxConns > maxMaxConns {
		return fail(fmt.Errorf("max_conns: %d is out of range (1 to %d)", s.MaxConns, maxMaxConns))
	}
	if o.timeout = time.Duration(s.StatementTimeout); o.timeout == 0 {
		o.timeout = DefaultStatementTimeout
	}
	if err := cfargs.Bounds("statement_timeout", o.timeout, minStatementTimeout, MaxStatementTimeout); err != nil {
		return fail(err)
	}
	if o.cleanup = time.Duration(s.CleanupInterval); o.cleanup == 0 {
		o.cleanup = DefaultCleanupInterval
	}
	if err := cfargs.Bounds("cleanup_interval", o.cleanup, minCleanupInterval, 0); err != nil {
		return fail(err)
	}

	dsn, err := cfargs.Resolve(caddy.NewReplacer(), "dsn", s.DSN)
	if err != nil {
		return fail(err)
	}
	o.password = dsnPassword(dsn)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, o.scrub(fmt.Errorf("postgres store: dsn: %v", parseError(dsn, err)))
	}
	if cfg.ConnConfig.Password != "" {
		o.password = cfg.ConnConfig.Password
	}
	if s.MaxConns > 0 {
		cfg.MaxConns = int32(s.MaxConns)
	}
	cc := cfg.ConnConfig
	if cc.ConnectTimeout == 0 || cc.ConnectTimeout > o.timeout {
		cc.ConnectTimeout = o.timeout
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["statement_timeout"] = strconv.FormatInt(o.timeout.Milliseconds(), 10)
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = "caddy-sangho-dedup"
	}
	o.config = cfg

	o.norm = map[string]any{
		"dsn": dsn, "max_conns": cfg.MaxConns, "create": o.create,
		"timeout": o.timeout, "cleanup": o.cleanup, "table": o.qualified(), "cache": o.cache,
	}
	return o, nil
}

// parseError is pgx's parse error without the connection string (which
// pgx redacts only as well as it can parse it). A keyword=value string
// that does not split into pairs gets a fixed message: pgx quotes the
// words around the fault, which may be part of a password written with
// a space and no quotes (password=Sec r3t).
func parseError(dsn string, err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) && !strings.Contains(dsn, "://") && strings.Contains(pe.Error(), "keyword/value") {
		return errors.New("not keyword=value pairs: a value with a space, a quote or a backslash is written in single quotes, with \\' and \\\\ inside (password='a b'); " +
			"what went wrong is not shown, as it may quote part of the password")
	}
	if errors.As(err, &pe) {
		c := *pe
		c.ConnString = "…"
		return errors.New(strings.TrimPrefix(c.Error(), "cannot parse `…`: "))
	}
	return err
}

// dsnPassword finds the password in a connection string that pgx may
// fail to parse, leniently, so that it can be scrubbed from errors.
func dsnPassword(dsn string) string {
	if i := strings.Index(dsn, "://"); i >= 0 {
		rest := dsn[i+3:]
		if j := strings.IndexAny(rest, "/?#"); j >= 0 && strings.LastIndex(rest[:j], "@") < 0 {
			rest = rest[:j]
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				return pw
			}
		}
		if k := strings.Index(dsn, "password="); k >= 0 {
			v := dsn[k+len("password="):]
			if e := strings.IndexAny(v, "&#"); e >= 0 {
				v = v[:e]
			}
			return v
		}
		return ""
	}
	if k := strings.Index(dsn, "password"); k >= 0 {
		v := strings.TrimLeft(dsn[k+len("password"):], " =")
		if strings.HasPrefix(v, "'") {
			v = v[1:]
			if e := strings.Index(v, "'"); e >= 0 {
				v = v[:e]
			}
			return v
		}
		if e := strings.IndexByte(v, ' '); e >= 0 {
			v = v[:e]
		}
		return v
	}
	return ""
}

// scrub replaces the password in err's text.
func (o *options) scrub(err error) error {
	if err == nil || len(o.password) < 1 {
		return err
	}
	msg := err.Error()
	if !strings.Contains(msg, o.password) {
		return err
	}
	return &scrubbed{msg: strings.ReplaceAll(msg, o.password, "xxxxx"), err: err}
}

// scrubbed is an error whose text lost the password; Unwrap keeps the
// cause for errors.As (e.g. a *pgconn.PgError).
type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// qualified is the table as SQL, quoted (names are already folded).
func (o *options) qualified() string {
	if o.schema != "" {
		return pgx.Identifier{o.schema, o.table}.Sanitize()
	}
	return pgx.Identifier{o.table}.Sanitize()
}

// poolKey keys the shared pool on everything that makes two differ.
func (o *options) poolKey() string {
	b, _ := json.Marshal(o.norm)
	sum := sha256.Sum256(b) // the password is part of it: keep the key opaque
	return "sangho_dedup.postgres." + hex.EncodeToString(sum[:])
}

// stateID names the table these options reach as far as the DSN tells,
// for when the server cannot be asked (see sharedDB.identify): the
// servers (host and port, each spelled one way), the database (the
// user's name when the DSN names none, as the server takes it) and the
// table (an unqualified table counted as public's). pgx has already
// filled in what libpq fills in: PG* variables, host (the socket
// directory or localhost), port 5432, user (the OS user).
func (o *options) stateID() string {
	cc := o.config.ConnConfig
	hosts := []string{canonicalAddr(cc.Host, cc.Port)}
	for _, f := range cc.Fallbacks {
		if a := canonicalAddr(f.Host, f.Port); !slices.Contains(hosts, a) {
			hosts = append(hosts, a)
		}
	}
	slices.Sort(hosts)
	db := cc.Database
	if db == "" {
		db = cc.User
	}
	return "postgres " + strings.Join(hosts, ",") + " db " + db + " table " + o.schema + "." + o.table
}

// canonicalAddr spells a server address one way without resolving it.
// A Unix socket (its directory, whatever it is) counts as localhost on
// its port: the socket file is named after the server's port, so a
// socket and localhost with one port are one server but where two
// servers of one machine share a port number (network namespaces),
// and counting those two as one only asks for a key_prefix each.
func canonicalAddr(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		host = "localhost"
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	if host == "127.0.0.1" || host == "::1" {
		host = "localhost"
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// sharedDB is a pool and what goes with it (the table check, the
// retention sweeper), shared by every config with the same settings.
type sharedDB struct {
	pool  *pgxpool.Pool
	opts  *options
	sql   statements
	check *tableCheck
	cache *doneCache // nil when local_cache is off
	lis   *listener
	group *grouper // new events' inserts and held leases' commits, grouped (group.go)
	stop  chan struct{}
	done  chan struct{}

	beforeRenew func() // tests: called when a retried claim found its lease, before it renews it

	sweepAt atomic.Int64 // the block the next sweep batch starts at

	noStartupTimeout atomic.Bool // a pooler refused statement_timeout as a startup parameter (pooler.go)

	name storepool.DataName // the table as the server names it (identify)
}

func newSharedDB(o *options, logger *zap.Logger) (*sharedDB, error) {
	db := &sharedDB{opts: o, sql: newStatements(o.qualified()),
		stop: make(chan struct{}), done: make(chan struct{})}
	o.config.BeforeConnect = db.beforeConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), o.config)
	if err != nil {
		return nil, err
	}
	db.pool = pool
	db.check = newTableCheck(db)
	db.group = newGrouper(db)
	if o.cache > 0 {
		db.cache = newDoneCache(o.cache)
		db.lis = newListener(db, db.cache, logger)
	}
	go db.sweeper(logger)
	return db, nil
}

// Destruct stops the sweeper and closes the pool.
func (db *sharedDB) Destruct() error {
	close(db.stop)
	<-db.done
	db.group.wait()
	if db.lis != nil {
		db.lis.close()
	}
	db.pool.Close()
	return nil
}

// UnmarshalJSON decodes the JSON config as Caddy does, a bad duration
// answered with its key (cfargs.DecodeJSON).
func (s *Store) UnmarshalJSON(b []byte) error {
	type plain Store // without this method
	return cfargs.DecodeJSON(b, (*plain)(s))
}

// Interface guards
var (
	_ dedup.Store        = (*Store)(nil)
	_ dedup.DataSharer   = (*Store)(nil)
	_ dedup.UseCounter   = (*Store)(nil)
	_ caddy.Provisioner  = (*Store)(nil)
	_ caddy.CleanerUpper = (*Store)(nil)
	_ caddy.Destructor   = (*sharedDB)(nil)
)
