package postgres

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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
//	}
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store type
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if seen[opt] {
			return d.Errf("postgres: %s given twice", opt)
		}
		seen[opt] = true
		var val string
		if !d.AllArgs(&val) {
			return d.Errf("postgres: %s takes one value", opt)
		}
		switch opt {
		case "dsn":
			s.DSN = val
		case "table":
			if _, _, err := parseTable(val); err != nil {
				return d.Errf("postgres: %v", err)
			}
			s.Table = val
		case "max_conns":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return d.Errf("postgres: max_conns: %q is not a positive number", val)
			}
			s.MaxConns = n
		case "create_table":
			switch val {
			case "on":
				on := true
				s.CreateTable = &on
			case "off":
				off := false
				s.CreateTable = &off
			default:
				return d.Errf("postgres: create_table: %q is neither on nor off", val)
			}
		case "statement_timeout", "cleanup_interval":
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 {
				return d.Errf("postgres: %s: %q is not a positive duration", opt, val)
			}
			if opt == "statement_timeout" {
				s.StatementTimeout = caddy.Duration(dur)
			} else {
				s.CleanupInterval = caddy.Duration(dur)
			}
		default:
			return d.Errf("postgres: unrecognized subdirective %q", opt)
		}
	}
	return nil
}

var _ caddyfile.Unmarshaler = (*Store)(nil)
