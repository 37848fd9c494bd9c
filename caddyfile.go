package sanghodedup

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"golang.org/x/net/http/httpguts"

	"github.com/sangho/caddy-sangho-dedup/internal/cfargs"
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
//		provider <name> [{ ... }] # default sangho; stripe, standard_webhooks, github, shopify, hmac {...}
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
//		name <string>               # default: the key_prefix without its trailing colon
//		on_payload_mismatch reject|log # default reject
//		store file [<path>]         # the default
//		store memory
//		store postgres {
//			...                     # see postgres.Store.UnmarshalCaddyfile
//		}
//		store redis {
//			...                     # see redis.Store.UnmarshalCaddyfile
//		}
//	}
//
// provider sets the sender's provider (module http.sangho_dedup.providers.<name>)
// and with it the defaults of signature_header, event_id_header and
// tolerance, and where the event ID comes from; the options above
// override those defaults. The hmac provider takes a block (see
// providers.HMAC.UnmarshalCaddyfile); the others take none.
func (m *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if err := cfargs.NoValue(d, "sangho_dedup", "its options, secret among them, go in its block"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for d.NextBlock(0) {
		opt := d.Val()
		if err := cfargs.Once(d, seen, "sangho_dedup", "secret"); err != nil {
			return err
		}
		switch opt {
		case "secret":
			file, line := d.File(), d.Line()
			args := d.RemainingArgs()
			if len(args) == 0 || slices.Contains(args, "") {
				return d.Err(cfargs.WithoutValue("secret", file, line))
			}
			dropped, inside := cfargs.EmptyVars("secret", file, line)
			if len(inside) > 0 {
				return d.Err(cfargs.InsideError("secret", inside, "a shorter secret than meant", cfargs.WholeValueHint(inside[0])))
			}
			if len(dropped) > 0 {
				return d.Err(cfargs.DroppedError("secret", dropped, "set it, or take it off the line; {env."+dropped[0]+"} is read when Caddy starts instead, and refused if empty"))
			}
			m.Secrets = append(m.Secrets, args...)
		case "tolerance":
			if err := cfargs.Duration(d, &m.Tolerance, MinWindow, MaxTolerance); err != nil {
				return err
			}
		case "max_body_size":
			var s string
			if err := cfargs.One(d, &s); err != nil {
				return err
			}
			// humanize reads ',' as a thousands separator: 1,5MiB (a
			// decimal comma) would be 15 MiB.
			if strings.Contains(s, ",") {
				return d.Errf("max_body_size: %q has a comma, a decimal point to some and a thousands separator to others: write 1.5MiB or 1572864", s)
			}
			size, err := humanize.ParseBytes(s)
			if err != nil || size == 0 {
				return d.Errf("max_body_size: invalid size %q (e.g. 512KB, 1MiB, 1048576)", s)
			}
			// humanize drops a fraction of a byte: 1.5 would be 1 byte,
			// every delivery 413; most likely a unit left out.
			num := strings.TrimRight(s, "bB")
			if f, err := strconv.ParseFloat(num, 64); err == nil && f != math.Trunc(f) {
				return d.Errf("max_body_size: %s is not a whole number of bytes (with a unit? e.g. %sMiB)", s, num)
			}
			if size > MaxMaxBodySize {
				return d.Errf("max_body_size: %s is over the maximum of 64MiB", s)
			}
			m.MaxBodySize = int64(size)
		case "event_id_header":
			if err := cfargs.One(d, &m.EventIDHeader); err != nil {
				return err
			}
			if !httpguts.ValidHeaderFieldName(m.EventIDHeader) {
				return d.Errf("event_id_header: %q is not a valid header name", m.EventIDHeader)
			}
		case "signature_header":
			if err := cfargs.One(d, &m.SignatureHeader); err != nil {
				return err
			}
			if !httpguts.ValidHeaderFieldName(m.SignatureHeader) {
				return d.Errf("signature_header: %q is not a valid header name", m.SignatureHeader)
			}
		case "retention":
			if err := cfargs.Duration(d, &m.Retention, MinWindow, MaxRetention); err != nil {
				return err
			}
		case "lock_ttl":
			if err := cfargs.Duration(d, &m.LockTTL, minLockTTL, MaxLockTTL); err != nil {
				return err
			}
		case "retry_after":
			if err := cfargs.Duration(d, &m.RetryAfter, 0, MaxRetryAfter); err != nil {
				return err
			}
		case "on_store_error":
			if err := cfargs.One(d, &m.OnStoreError); err != nil {
				return err
			}
			if m.OnStoreError != storeErrorReject && m.OnStoreError != storeErrorPass {
				return d.Errf("on_store_error: must be %s or %s, not %q", storeErrorReject, storeErrorPass, m.OnStoreError)
			}
		case "require_body_id":
			var v string
			if err := cfargs.One(d, &v); err != nil {
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
			// An unset {$VAR} in it would leave another namespace of
			// event IDs (tenant_ for tenant_{$TENANT}), shared by every
			// config whose variable is missing.
			if _, inside := cfargs.EmptyVars("key_prefix", d.File(), d.Line()); len(inside) > 0 {
				return d.Err(cfargs.InsideError("key_prefix", inside, "another namespace of event IDs", "set it, or write the prefix itself"))
			}
			if err := cfargs.One(d, &m.KeyPrefix); err != nil {
				return err
			}
		case "name":
			if err := cfargs.One(d, &m.Name); err != nil {
				return err
			}
		case "on_payload_mismatch":
			if err := cfargs.One(d, &m.OnPayloadMismatch); err != nil {
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
			if err := cfargs.Known(d, "provider", "http.sangho_dedup.providers"); err != nil {
				return err
			}
			mod, err := caddyfile.UnmarshalModule(d, "http.sangho_dedup.providers."+name)
			if err != nil {
				// The one prefix: the providers' parsers add none.
				return fmt.Errorf("provider %s: %w", name, err)
			}
			m.ProviderRaw = caddyconfig.JSONModuleObject(mod, "name", name, nil)
		case "store":
			if !d.NextArg() {
				return d.ArgErr()
			}
			name := d.Val()
			if err := cfargs.Known(d, "store", "http.sangho_dedup.stores"); err != nil {
				return err
			}
			mod, err := caddyfile.UnmarshalModule(d, "http.sangho_dedup.stores."+name)
			if err != nil {
				return fmt.Errorf("store %s: %w", name, err)
			}
			m.StoreRaw = caddyconfig.JSONModuleObject(mod, "type", name, nil)
		default:
			return cfargs.Unknown(d, "sangho_dedup subdirective", m)
		}
	}
	if len(m.Secrets) == 0 {
		return d.Err("sangho_dedup: at least one secret is required")
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
