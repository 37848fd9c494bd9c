package postgres

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
)

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store postgres {
//		dsn               <dsn>
//		table             <name>
//		max_conns         <n>
//		create_table      on|off
//		statement_timeout <duration>
//		cleanup_interval  <duration>
//		local_cache       <entries>|off
//	}
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store type
	if err := cfargs.NoValue(d, "", "write dsn <dsn> in its block"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := cfargs.Once(d, seen, "postgres store", ""); err != nil {
			return err
		}
		var err error
		switch opt {
		case "dsn":
			if _, inside := cfargs.EmptyVars("dsn", d.File(), d.Line()); len(inside) > 0 {
				return d.Err(cfargs.InsideError("dsn", inside, "another server", cfargs.WholeValueHint(inside[0])))
			}
			err = cfargs.Secret(d, &s.DSN)
		case "table":
			if err = cfargs.One(d, &s.Table); err == nil {
				if _, _, perr := parseTable(s.Table); perr != nil {
					err = d.Errf("postgres store: %v", perr)
				}
			}
		case "max_conns":
			var v string
			if err = cfargs.One(d, &v); err == nil {
				if s.MaxConns, err = strconv.Atoi(v); err != nil || s.MaxConns < 1 || s.MaxConns > maxMaxConns {
					err = d.Errf("max_conns: must be 1 to %d, not %q", maxMaxConns, v)
				}
			}
		case "create_table":
			var v string
			if err = cfargs.One(d, &v); err == nil {
				if v != "on" && v != "off" {
					err = d.Errf("create_table: %q is neither on nor off", v)
				}
				on := v == "on"
				s.CreateTable = &on
			}
		case "statement_timeout":
			err = cfargs.Duration(d, &s.StatementTimeout, minStatementTimeout, MaxStatementTimeout)
		case "cleanup_interval":
			err = cfargs.Duration(d, &s.CleanupInterval, minCleanupInterval, 0)
		case "local_cache":
			var v string
			if err = cfargs.One(d, &v); err == nil && v != "off" {
				if s.LocalCache, err = strconv.Atoi(v); err != nil || s.LocalCache < 0 {
					err = d.Errf("local_cache: must be a number of entries or off, not %q", v)
				}
			}
		default:
			return cfargs.Unknown(d, "postgres store subdirective", s)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var _ caddyfile.Unmarshaler = (*Store)(nil)
