package redis

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddytls"

	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
)

// UnmarshalCaddyfile sets up the store from Caddyfile tokens:
//
//	store redis {
//		address <host:port...>
//		url <redis://...|rediss://...|unix://...>
//		master_name <name>
//		cluster
//		username <user>
//		password <password>
//		db <n>
//		tls
//		tls_trust_pool <module> ...           # e.g. tls_trust_pool file /etc/redis/ca.pem
//		tls_client_auth <cert_file> <key_file>
//		tls_server_name <name>
//		tls_insecure_skip_verify
//		dial_timeout <duration>
//		read_timeout <duration>
//		write_timeout <duration>
//		pool_size <n>
//		disable_pipeline
//		wait_replicas <n>
//		wait_timeout <duration>
//		local_cache <entries>|off
//	}
func (s *Store) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // store type
	if err := cfargs.NoValue(d, "", "write url <url> or address <host:port> in its block"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := cfargs.Once(d, seen, "redis store", "address"); err != nil {
			return err
		}
		switch opt {
		case "address":
			dropped, inside := cfargs.EmptyVars("address", d.File(), d.Line())
			if len(dropped) > 0 {
				return d.Err(cfargs.DroppedError("address", dropped, "set it, or take it off the line"))
			}
			if len(inside) > 0 {
				return d.Err(cfargs.InsideError("address", inside, "another server", cfargs.WholeValueHint(inside[0])))
			}
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			s.Address = append(s.Address, args...)
		case "url":
			if _, inside := cfargs.EmptyVars("url", d.File(), d.Line()); len(inside) > 0 {
				return d.Err(cfargs.InsideError("url", inside, "another server", cfargs.WholeValueHint(inside[0])))
			}
			if err := cfargs.Secret(d, &s.URL); err != nil {
				return err
			}
		case "master_name":
			if err := cfargs.One(d, &s.MasterName); err != nil {
				return err
			}
		case "username":
			if err := cfargs.One(d, &s.Username); err != nil {
				return err
			}
		case "password":
			if err := cfargs.Secret(d, &s.Password); err != nil {
				return err
			}
		case "db":
			if err := cfargs.Int(d, &s.DB); err != nil {
				return err
			}
		case "tls":
			if err := cfargs.Flag(d, &s.TLS); err != nil {
				return err
			}
		case "cluster":
			if err := cfargs.Flag(d, &s.Cluster); err != nil {
				return err
			}
		case "tls_trust_pool":
			if !d.NextArg() {
				return d.Err("tls_trust_pool: needs a CA pool module, e.g. tls_trust_pool file /etc/redis/ca.pem")
			}
			stem := d.Val()
			mod, err := caddyfile.UnmarshalModule(d, "tls.ca_pool.source."+stem)
			if err != nil {
				return fmt.Errorf("tls_trust_pool: %w", err)
			}
			ca, ok := mod.(caddytls.CA)
			if !ok {
				return d.Errf("tls_trust_pool: module %q is not a CA pool", stem)
			}
			s.TLSTrustPoolRaw = caddyconfig.JSONModuleObject(ca, "provider", stem, nil)
		case "tls_client_auth":
			if !d.AllArgs(&s.TLSClientCertificateFile, &s.TLSClientCertificateKeyFile) {
				return d.Err("tls_client_auth: needs <cert_file> <key_file> (reverse_proxy's one-argument automate form is not supported)")
			}
		case "tls_server_name":
			if err := cfargs.One(d, &s.TLSServerName); err != nil {
				return err
			}
		case "tls_insecure_skip_verify":
			if err := cfargs.Flag(d, &s.TLSInsecureSkipVerify); err != nil {
				return err
			}
		case "dial_timeout":
			if err := cfargs.Duration(d, &s.DialTimeout, 0, MaxTimeout); err != nil {
				return err
			}
		case "read_timeout":
			if err := cfargs.Duration(d, &s.ReadTimeout, 0, MaxTimeout); err != nil {
				return err
			}
		case "write_timeout":
			if err := cfargs.Duration(d, &s.WriteTimeout, 0, MaxTimeout); err != nil {
				return err
			}
		case "pool_size":
			if err := cfargs.Int(d, &s.PoolSize); err != nil {
				return err
			}
		case "wait_replicas":
			if err := cfargs.Int(d, &s.WaitReplicas); err != nil {
				return err
			}
		case "wait_timeout":
			if err := cfargs.Duration(d, &s.WaitTimeout, 0, MaxTimeout); err != nil {
				return err
			}
		case "local_cache":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			n := 0
			if v != "off" {
				var err error
				if n, err = strconv.Atoi(v); err != nil || n < 0 {
					return d.Errf("local_cache: must be a number of entries or off, not %q", v)
				}
			}
			s.LocalCache = &n
		case "disable_pipeline":
			if err := cfargs.Flag(d, &s.DisablePipeline); err != nil {
				return err
			}
		case "pipeline":
			// The former Caddyfile name: refused with a pointer to the one name.
			return d.Err("pipeline: the option is now disable_pipeline (no argument), as in JSON; pipelining is on unless it is given")
		default:
			return cfargs.Unknown(d, "redis store option", s)
		}
	}
	return nil
}
