package sanghodedup

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// endpoints records the handlers of every loaded config: which secret
// set uses which store data and key prefix (see registerEndpoint), and
// which handler answers to which name (for the admin API).
var endpoints = struct {
	sync.Mutex
	seq      uint64
	byConfig map[any]*configEndpoints
}{byConfig: map[any]*configEndpoints{}}

type configEndpoints struct {
	seq      uint64 // configs loaded later have higher numbers
	handlers int    // provisioned so far
	uses     map[string]endpointUse
	names    map[string]*Handler         // the first handler of each name
	prefixes map[string][]endpointPrefix // by store data: the key_prefixes used on it
	checked  map[*caddyhttp.Server]bool  // servers whose routes warnOpenPaths read
}

// endpointPrefix is a key_prefix, and the first handler that used it.
type endpointPrefix struct{ prefix, handler string }

type endpointUse struct {
	secrets [sha256.Size]byte // of the sorted secret set; never printed
	handler string            // "handler #n" in provisioning order, and its server's listeners
	name    string
	alts    []string // the same data and key_prefix under the store's other names (dedup.DataAliaser)
}

// configOf names the loaded config ctx belongs to. Caddy provisions each
// server's handlers with a context of its own (the config's, wrapped with
// the server as a value), so the context itself names a server, not the
// config: two site blocks would each get a registry and swallow each
// other's events unchecked. The wrapping keeps the config's cancellation,
// so its Done channel is one for every server of one config, and another
// for the next config (a reload).
func configOf(ctx caddy.Context) any {
	if done := ctx.Done(); done != nil {
		return done
	}
	return ctx.Context // a context that is never cancelled: not Caddy's
}

// dataOf names the data a store reaches, for comparisons (a handler
// keeps its store's in storeData).
func dataOf(s dedup.Store) string {
	if sh, ok := s.(dedup.DataSharer); ok {
		return sh.DataID()
	}
	return fmt.Sprintf("%T %p", s, s)
}

// registerEndpoint records h in its config, and refuses:
//   - a handler that would share store data and key_prefix with
//     another one under different secrets: a payment provider sends one
//     event to every endpoint that subscribes, so the second endpoint
//     would answer it as a duplicate and its backend would never see it
//     (the same endpoint on several routes, same secrets, is fine);
//   - a name already given to a handler with another store or prefix.
func (h *Handler) registerEndpoint(ctx caddy.Context, secrets []string) error {
	sorted := slices.Clone(secrets)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	sum := sha256.New()
	for _, s := range sorted {
		sum.Write([]byte(s))
		sum.Write([]byte{0})
	}
	use := endpointUse{name: h.Name}
	sum.Sum(use.secrets[:0])
	where := place(h.storeData, h.KeyPrefix)

	endpoints.Lock()
	defer endpoints.Unlock()
	h.cfgKey = configOf(ctx)
	cfg := endpoints.byConfig[h.cfgKey]
	if cfg == nil {
		endpoints.seq++
		cfg = &configEndpoints{seq: endpoints.seq, uses: map[string]endpointUse{}, names: map[string]*Handler{}, prefixes: map[string][]endpointPrefix{}}
		endpoints.byConfig[h.cfgKey] = cfg
	}
	cfg.handlers++
	use.handler = "handler #" + strconv.Itoa(cfg.handlers)
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && len(srv.Listen) > 0 {
		use.handler += ", listening on " + strings.Join(srv.Listen, " ")
	}
	if prev, ok := cfg.uses[where]; ok && prev.secrets != use.secrets {
		return h.sharedStateError(prev, use, where)
	} else if ok && prev.name != use.name {
		// The same secret is taken for one endpoint on several routes;
		// named apart, they may feed different backends, and one event
		// sent to both (one Shopify app's secret signs every
		// subscription) would reach the first one's only.
		h.logger.Warn("endpoints share their event IDs", zap.String("other", prev.name), zap.String("other_handler", prev.handler),
			zap.String("handler", use.handler), zap.String("store", where),
			zap.String("fix", "an event sent to both is processed by the first to get it, and answered as its duplicate at the other: if they feed different backends, give each its own key_prefix (the one that ran before keeps its own); if they are one endpoint, give them one name"))
	} else if !ok {
		for _, other := range cfg.prefixes[h.storeData] {
			if prefixesOverlap(other.prefix, h.KeyPrefix) {
				return fmt.Errorf("sangho_dedup: key_prefix %q (%s) and key_prefix %q (%s) overlap on one store (%s): "+
					"an event under one can have the same key as an event or a signature record under the other, and be answered as its duplicate, never reaching its backend; "+
					"give the second a name and a ':' after the first (e.g. key_prefix %s<name>:, any name but sig) or a prefix of its own",
					other.prefix, other.handler, h.KeyPrefix, use.handler, h.storeData, other.prefix)
			}
		}
		cfg.prefixes[h.storeData] = append(cfg.prefixes[h.storeData], endpointPrefix{h.KeyPrefix, use.handler})
		use.alts = h.dataAliases()
		cfg.uses[where] = use
	}
	if other, ok := cfg.names[h.Name]; ok {
		if other.storeData != h.storeData || other.KeyPrefix != h.KeyPrefix {
			return fmt.Errorf("sangho_dedup: two handlers are named %q but use different stores or key_prefixes (%s key_prefix %q, %s key_prefix %q): give each endpoint its own name",
				h.Name, other.storeData, other.KeyPrefix, h.storeData, h.KeyPrefix)
		}
	} else {
		cfg.names[h.Name] = h
	}
	return nil
}

// place names store data and a key_prefix on it, as the registry and
// its messages write them.
func place(data, prefix string) string { return data + " key_prefix " + strconv.Quote(prefix) }

// dataAliases is h's store data and key_prefix under the store's other
// names (see dedup.DataAliaser), as registerEndpoint writes them.
func (h *Handler) dataAliases() []string {
	a, ok := h.store.(dedup.DataAliaser)
	if !ok {
		return nil
	}
	var alts []string
	for _, alias := range a.DataAliases() {
		alts = append(alts, place(alias, h.KeyPrefix))
	}
	return alts
}

// warnMoved warns, as old is cleaned up after a reload (the config loaded
// after it is provisioned whole by then), of each store data and
// key_prefix that old's endpoints used and the newer config's use no
// more for the same secrets, which they use on data old did not: the events
// processed there are unknown to the new data, their redeliveries
// processed again. An endpoint added or removed, or one that keeps its
// data beside new data, is no move. Called with endpoints locked.
func warnMoved(old *configEndpoints) {
	var cur *configEndpoints
	for _, c := range endpoints.byConfig {
		if c.seq > old.seq && (cur == nil || c.seq > cur.seq) {
			cur = c
		}
	}
	if cur == nil {
		return // a shutdown, or a load that failed
	}
	for _, was := range slices.Sorted(maps.Keys(old.uses)) {
		use := old.uses[was]
		var now []string // the data these secrets use that old did not
		kept := false
		for _, where := range slices.Sorted(maps.Keys(cur.uses)) {
			u := cur.uses[where]
			if u.secrets != use.secrets {
				continue
			}
			for _, w := range append([]string{was}, use.alts...) {
				kept = kept || w == where || slices.Contains(u.alts, w)
			}
			if o, ok := old.uses[where]; !ok || o.secrets != use.secrets {
				now = append(now, where)
			}
		}
		if kept || len(now) == 0 {
			continue
		}
		if h := cur.names[cur.uses[now[0]].name]; h != nil {
			h.logger.Warn("endpoint moved to other data", zap.String("was", was), zap.Strings("now", now),
				zap.String("fix", "the events processed before are not known here, and their redeliveries are processed again; if that is not meant, put the store and key_prefix back (see operations.md, Changing the store)"))
		}
	}
}

// sharedStateError refuses two endpoints with different secrets on one
// store and key_prefix, and says how to part them without losing the
// records already stored: a name does not change the prefix, so the
// endpoint that ran before keeps its prefix, and its records with it.
func (h *Handler) sharedStateError(prev, use endpointUse, where string) error {
	shared := ""
	if strings.HasPrefix(h.storeData, "file ") {
		shared = " A file store is shared by every site of this Caddy that uses it, the default store's too (one per Caddy, in its data directory)."
	}
	// Caddy provisions servers in no set order: name the endpoints in
	// one, so that the same config gets the same advice.
	example := "key_prefix " + h.KeyPrefix + "<name>:"
	if a, b := prev.name, use.name; a != defaultName(h.KeyPrefix) && b != defaultName(h.KeyPrefix) && a != b {
		if a > b {
			a, b = b, a
		}
		example = fmt.Sprintf("key_prefix %s%s: in %q if %q ran before, or key_prefix %s%s: in %q if %q did",
			h.KeyPrefix, b, b, a, h.KeyPrefix, a, a, b)
	}
	return fmt.Errorf("sangho_dedup endpoints %q (%s) and %q (%s) share one store (%s) with different secrets: "+
		"one endpoint would answer the other's events as duplicates and its backend would never see them.%s "+
		"Give each endpoint its own key_prefix: leave the one that ran before as it is (its records are stored under its prefix; a name does not change it), "+
		"and give the other a prefix of its own, e.g. %s",
		prev.name, prev.handler, use.name, use.handler, where, shared, example)
}

// Cleanup forgets this handler's config in the registry of endpoints,
// and logs the signature rejections not logged yet.
func (h *Handler) Cleanup() error {
	if h.sigRejects != nil {
		h.sigRejects.stop()
	}
	if h.cfgKey != nil {
		endpoints.Lock()
		if old := endpoints.byConfig[h.cfgKey]; old != nil {
			warnMoved(old) // once: its first handler cleaned up deletes it
		}
		delete(endpoints.byConfig, h.cfgKey)
		endpoints.Unlock()
	}
	return nil
}

// currentEndpoints returns the handlers by name of the config loaded
// last (the running one; during a reload, the new one).
func currentEndpoints() map[string]*Handler {
	endpoints.Lock()
	defer endpoints.Unlock()
	var newest *configEndpoints
	for _, cfg := range endpoints.byConfig {
		if newest == nil || cfg.seq > newest.seq {
			newest = cfg
		}
	}
	if newest == nil {
		return nil
	}
	return maps.Clone(newest.names)
}

// prefixesOverlap reports whether two different key_prefixes on one
// store share keys: a key is key_prefix + an event ID (validID), or +
// "sig:" and 64 lowercase hex digits (a signature record, see
// signatureKey). They do when the longer is the shorter followed by
// what may begin an event ID, or by "sig:" and what may begin the hex.
func prefixesOverlap(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	if a == b || !strings.HasPrefix(b, a) {
		return false
	}
	rest := b[len(a):]
	if validID(rest) && len(rest) < maxIDLen {
		return true
	}
	hexPart, ok := strings.CutPrefix(rest, "sig:")
	return ok && len(hexPart) < sha256.Size*2 && strings.Trim(hexPart, "0123456789abcdef") == ""
}
