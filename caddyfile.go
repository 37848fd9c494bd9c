package sanghodedup

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"golang.org/x/net/http/httpguts"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("sangho_dedup", parseCaddyfile)
	// Run before the handlers that answer or proxy, so that no `order`
	// line is needed: after forward_auth, before handle, route, respond,
	// reverse_proxy, php_fastcgi and file_server.
	httpcaddyfile.RegisterDirectiveOrder("sangho_dedup", httpcaddyfile.After, "forward_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	sangho_dedup [<matcher>] {
//		provider <scheme> [{ ... }] # default sangho; stripe, standard_webhooks, github, shopify, hmac {...}
//		secret <secret...>          # required; repeatable; a whole {env.X} or {file./path} is resolved
//		tolerance <duration>        # default: the provider's (5m where it signs a timestamp)
//		max_body_size <size>        # default 1MiB; 512KB, 1MiB, 1048576; at most 64MiB
//		event_id_header <name>      # default: the provider's (Sangho-Event-ID)
//		signature_header <name>     # default: the provider's (Sangho-Signature)
//		retention <duration>        # default 72h
//		lock_ttl <duration>         # default 30s
//		retry_after <duration>      # default 10s
//		on_store_error reject|pass  # default reject
//		require_body_id on|off      # default on
//		key_prefix <string>         # default "sangho_dedup:"
//		name <string>               # default: the key_prefix
//		on_payload_mismatch reject|log # default reject
//		store file [<path>]         # the default
//		store memory
//		store redis {
//			...                     # see RedisStore.UnmarshalCaddyfile
//		}
//	}
//
// provider sets the signature scheme (module http.sangho_dedup.verifiers.<scheme>)
// and with it the defaults of signature_header, event_id_header and
// tolerance, and where the event ID comes from; the options above
// override those defaults. The hmac scheme takes a block (see
// HMACScheme.UnmarshalCaddyfile); the others take none.
func (m *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		opt := d.Val()
		if err := once(d, seen, "sangho_dedup", "secret"); err != nil {
			return err
		}
		switch opt {
		case "secret":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			m.Secrets = append(m.Secrets, args...)
		case "tolerance":
			if err := durationArg(d, &m.Tolerance); err != nil {
				return err
			}
		case "max_body_size":
			var s string
			if err := oneArg(d, &s); err != nil {
				return err
			}
			size, err := humanize.ParseBytes(s)
			if err != nil || size == 0 {
				return d.Errf("max_body_size: invalid size %q (e.g. 512KB, 1MiB, 1048576)", s)
			}
			if size > MaxMaxBodySize {
				return d.Errf("max_body_size: %s is over the maximum of 64MiB", s)
			}
			m.MaxBodySize = int64(size)
		case "event_id_header":
			if err := oneArg(d, &m.EventIDHeader); err != nil {
				return err
			}
			if !httpguts.ValidHeaderFieldName(m.EventIDHeader) {
				return d.Errf("event_id_header: %q is not a valid header name", m.EventIDHeader)
			}
		case "signature_header":
			if err := oneArg(d, &m.SignatureHeader); err != nil {
				return err
			}
			if !httpguts.ValidHeaderFieldName(m.SignatureHeader) {
				return d.Errf("signature_header: %q is not a valid header name", m.SignatureHeader)
			}
		case "retention":
			if err := durationArg(d, &m.Retention); err != nil {
				return err
			}
		case "lock_ttl":
			if err := durationArg(d, &m.LockTTL); err != nil {
				return err
			}
		case "retry_after":
			if err := durationArg(d, &m.RetryAfter); err != nil {
				return err
			}
		case "on_store_error":
			if err := oneArg(d, &m.OnStoreError); err != nil {
				return err
			}
			if m.OnStoreError != storeErrorReject && m.OnStoreError != storeErrorPass {
				return d.Errf("on_store_error: must be %s or %s, not %q", storeErrorReject, storeErrorPass, m.OnStoreError)
			}
		case "require_body_id":
			var v string
			if err := oneArg(d, &v); err != nil {
				return err
			}
			switch v {
			case "on", "off":
				on := v == "on"
				m.RequireBodyID = &on
			default:
				return d.Errf("require_body_id: must be on or off, not %q", v)
			}
		case "key_prefix":
			if err := oneArg(d, &m.KeyPrefix); err != nil {
				return err
			}
		case "name":
			if err := oneArg(d, &m.Name); err != nil {
				return err
			}
		case "on_payload_mismatch":
			if err := oneArg(d, &m.OnPayloadMismatch); err != nil {
				return err
			}
			if m.OnPayloadMismatch != mismatchReject && m.OnPayloadMismatch != mismatchLog {
				return d.Errf("on_payload_mismatch: must be %s or %s, not %q", mismatchReject, mismatchLog, m.OnPayloadMismatch)
			}
		case "provider":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			mod, err := caddyfile.UnmarshalModule(d, "http.sangho_dedup.verifiers."+name)
			if err != nil {
				// The one prefix: the schemes' parsers add none.
				return fmt.Errorf("provider %s: %w", name, err)
			}
			m.VerifierRaw = caddyconfig.JSONModuleObject(mod, "scheme", name, nil)
		case "store":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			mod, err := caddyfile.UnmarshalModule(d, "http.sangho_dedup.stores."+name)
			if err != nil {
				return fmt.Errorf("store %s: %w", name, err)
			}
			m.StoreRaw = caddyconfig.JSONModuleObject(mod, "type", name, nil)
		default:
			return d.Errf("unrecognized sangho_dedup subdirective %q", opt)
		}
	}
	if len(m.Secrets) == 0 {
		return d.Err("sangho_dedup: at least one secret is required")
	}
	return nil
}

// The helpers below are shared by the Caddyfile parsers of the handler,
// the stores and the verifiers; their errors name the option.

// once refuses a subdirective given a second time, except the
// repeatable one (whose values accumulate).
func once(d *caddyfile.Dispenser, seen map[string]bool, who, repeatable string) error {
	opt := d.Val()
	if opt == repeatable {
		return nil
	}
	if seen[opt] {
		return d.Errf("%s: %s given more than once", who, opt)
	}
	seen[opt] = true
	return nil
}

// flagArg sets the flag option in d.Val(), which takes no argument.
func flagArg(d *caddyfile.Dispenser, dst *bool) error {
	name := d.Val()
	if d.NextArg() {
		return d.Errf("%s: takes no argument, got %q", name, d.Val())
	}
	*dst = true
	return nil
}

// oneArg reads the one argument of the option in d.Val().
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	name := d.Val()
	if d.CountRemainingArgs() == 0 {
		return d.Errf("%s: needs a value", name)
	}
	if !d.AllArgs(dst) {
		return d.Errf("%s: takes one value, got more", name)
	}
	return nil
}

// intArg reads the one argument of the option in d.Val() as a
// non-negative whole number.
func intArg(d *caddyfile.Dispenser, dst *int) error {
	name, s := d.Val(), ""
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return d.Errf("%s: %q is not a non-negative whole number", name, s)
	}
	*dst = n
	return nil
}

// durationArg reads the one argument of the option in d.Val() as a
// positive duration (caddy.ParseDuration: 30s, 1h, 2d).
func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name, s := d.Val(), ""
	if err := oneArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("%s: invalid duration %q: %v", name, s, err)
	}
	if dur <= 0 {
		return d.Errf("%s: duration must be positive, got %q", name, s)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
