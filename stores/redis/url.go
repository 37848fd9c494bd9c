package redis

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// urlParams are the query parameters a url may carry; go-redis knows
// more (max_retries, protocol, pool_timeout, ...), but the store sets
// those itself, so they are refused rather than silently overridden.
var urlParams = []string{"client_name", "db", "dial_timeout", "pool_size", "read_timeout", "skip_verify", "write_timeout"}

// knownParams are the other parameters go-redis reads (v9.18), and
// credentials written as parameters: an error names one of them. Any
// other name may be a part of the password (one with an unescaped ? or
// & puts its tail in the query), so an error gives its position only.
var knownParams = []string{"addr", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter", "idle_timeout",
	"max_active_conns", "max_concurrent_dials", "max_conn_age", "max_idle_conns", "max_retries", "max_retry_backoff",
	"min_idle_conns", "min_retry_backoff", "password", "pipeline_pool_size", "pipeline_read_buffer_size",
	"pipeline_write_buffer_size", "pool_fifo", "pool_timeout", "protocol", "user", "username"}

// redisURL is what a url gives, as go-redis parsed it, with which
// settings it set.
type redisURL struct {
	opts                    *goredis.Options
	scheme                  string
	params                  map[string]bool
	hasUser, hasPass, hasDB bool
	skipVerify              bool
}

// parseRedisURL parses a redis://, rediss:// or unix:// URL and refuses
// any query parameter that is not honoured, with an error that names it
// and never holds the password (nor any value of the URL but the
// offending one, which is no secret).
func parseRedisURL(raw string) (*redisURL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errURLSyntax
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return nil, fmt.Errorf("url scheme %q is not supported (redis://, rediss:// or unix://)", u.Scheme)
	}
	// go-redis reads a url without // or without a host as
	// localhost:6379, and ends one at a #: another Redis than the one
	// written, so another dedup state. No part of the url is shown.
	switch {
	case strings.Contains(raw, "#"):
		return nil, errors.New("url holds a #, which ends a url there (not shown, as it may hold a password): percent-encode a # in the user or the password (%23)")
	case u.Opaque != "":
		return nil, fmt.Errorf("url: the // after %s: is missing (write redis://host:port, rediss://host:port or unix:///path; the url is not shown, as it may hold a password)", u.Scheme)
	case u.Scheme != "unix" && u.Hostname() == "":
		return nil, fmt.Errorf("url has no host: write %s://[user[:password]@]host[:port][/db]", u.Scheme)
	case u.Scheme != "unix" && u.Port() != "" && !validPort(u.Port()):
		return nil, errors.New("url: the port must be 1 to 65535 (a : in the user or the password must be percent-encoded: %3A)")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, errURLSyntax
	}
	if db := strings.Trim(u.Path, "/"); u.Scheme != "unix" && db != "" && q.Has("db") {
		return nil, errors.New("url: the database is given both in the path and as db: give it once")
	}
	r := &redisURL{scheme: u.Scheme, params: map[string]bool{}}
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		vals := q[name]
		switch {
		case !slices.Contains(urlParams, name) && slices.Contains(knownParams, name):
			return nil, fmt.Errorf("url parameter %q is not supported (supported: %s)", name, strings.Join(urlParams, ", "))
		case !slices.Contains(urlParams, name):
			return nil, fmt.Errorf("url parameter %d is not supported (supported: %s); its name is not shown, as it may be a part of a password with an unescaped ? or & (percent-encode them: %%3F, %%26)",
				paramPosition(u.RawQuery, name), strings.Join(urlParams, ", "))
		case len(vals) > 1:
			return nil, fmt.Errorf("url parameter %s given more than once", name)
		case vals[0] == "":
			return nil, fmt.Errorf("url parameter %s has no value", name)
		}
		v := vals[0]
		switch name {
		case "pool_size":
			if n, err := strconv.Atoi(v); err != nil || n <= 0 {
				return nil, errors.New("url parameter pool_size must be a positive whole number")
			} else if n > MaxPoolSize {
				return nil, fmt.Errorf("url parameter pool_size must be 1 to %d", MaxPoolSize)
			}
		case "db":
			if n, err := strconv.Atoi(v); err != nil || n < 0 {
				return nil, errors.New("url parameter db must be a whole number")
			}
		case "dial_timeout", "read_timeout", "write_timeout":
			// As go-redis reads them: a number of seconds or a Go
			// duration; zero or less (go-redis: no timeout) is refused.
			d, err := time.ParseDuration(v)
			if n, nerr := strconv.Atoi(v); nerr == nil {
				d, err = time.Duration(n)*time.Second, nil
			}
			if err != nil || d <= 0 {
				return nil, fmt.Errorf("url parameter %s must be a positive duration (e.g. 2s)", name)
			}
		case "skip_verify":
			if u.Scheme != "rediss" {
				return nil, errors.New("url parameter skip_verify needs a rediss:// url")
			}
			switch v {
			case "true", "1":
				r.skipVerify = true
			case "false", "0":
			default:
				return nil, errors.New("url parameter skip_verify must be true or false")
			}
		}
		r.params[name] = true
	}
	if db := strings.Trim(u.Path, "/"); u.Scheme != "unix" && db != "" {
		if n, err := strconv.Atoi(db); err != nil || n < 0 {
			return nil, errors.New("url: the path after host:port must be a database number, such as /0 (a / in the password must be percent-encoded: %2F); the value is not shown, as it may hold a password")
		}
	}
	r.opts, err = goredis.ParseURL(raw)
	if err != nil {
		return nil, errURLSyntax
	}
	if u.User != nil {
		r.hasUser = u.User.Username() != ""
		pw, _ := u.User.Password()
		r.hasPass = pw != ""
	}
	r.hasDB = r.params["db"] || (u.Scheme != "unix" && strings.Trim(u.Path, "/") != "")
	return r, nil
}

// errURLSyntax is any url that Go's URL parser or go-redis refuses. The
// parsers' own messages quote the part they stumbled on, which is a part
// of the password when it holds an unescaped / ? or # (the rest of the
// URL then reads as a port, a path or a query): no part of the url is
// shown, nor any parameter's value (see parseRedisURL).
var errURLSyntax = errors.New("invalid url (not shown, as it may hold a password): write redis://[user[:password]@]host[:port][/db][?parameter=value], " +
	"rediss://… or unix://[user[:password]@]/path, and percent-encode the characters / ? # @ : % in the user and the password (a / is %2F)")

// apply sets o from the URL, refusing a setting given both in the URL
// and as an option of its own.
func (r *redisURL) apply(o *goredis.UniversalOptions) error {
	both := func(name string) error { return fmt.Errorf("%s is set both in url and as an option", name) }
	po := r.opts
	o.Addrs = []string{po.Addr}
	for _, c := range []struct {
		name        string
		inURL, inOp bool
		set         func()
	}{
		{"username", r.hasUser, o.Username != "", func() { o.Username = po.Username }},
		{"password", r.hasPass, o.Password != "", func() { o.Password = po.Password }},
		{"db", r.hasDB, o.DB != 0, func() { o.DB = po.DB }},
		{"pool_size", r.params["pool_size"], o.PoolSize != 0, func() { o.PoolSize = po.PoolSize }},
		{"dial_timeout", r.params["dial_timeout"], o.DialTimeout != 0, func() { o.DialTimeout = po.DialTimeout }},
		{"read_timeout", r.params["read_timeout"], o.ReadTimeout != 0, func() { o.ReadTimeout = po.ReadTimeout }},
		{"write_timeout", r.params["write_timeout"], o.WriteTimeout != 0, func() { o.WriteTimeout = po.WriteTimeout }},
	} {
		if !c.inURL {
			continue
		}
		if c.inOp {
			return both(c.name)
		}
		c.set()
	}
	o.ClientName = po.ClientName
	return nil
}

// paramPosition is the place (from 1) of the first parameter called name
// in the raw query.
func paramPosition(raw, name string) int {
	for i, kv := range strings.Split(raw, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err == nil && k == name {
			return i + 1
		}
	}
	return 0
}
