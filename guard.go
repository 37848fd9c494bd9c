package sanghodedup

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// The load-time check for paths left open (issue 24): Caddy's path
// matcher is exact, so
//
//	sangho_dedup /github { … }
//	reverse_proxy app:3000
//
// checks POST /github, while POST /github/, /github/x and / reach the
// backend unsigned (and many applications route /github/ to the same
// handler). When a sangho_dedup route has a path matcher and a later
// route of the same route list matches every request and reaches
// reverse_proxy before any sangho_dedup or final answer (respond, error,
// file_server), the handler logs a warning naming the matcher and a path
// that stays open. `handle /github { sangho_dedup … reverse_proxy … }`
// has no matcher on the directive, so it never warns.
//
// A handler sees its siblings only through its server's route list
// (the server is a value of its provisioning context). Caddy provisions
// the routes of a list in order and drops each route's raw JSON once its
// handlers are loaded; so the first sangho_dedup handler of a server
// (none comes before it) checks the server's routes from its own on,
// which are still raw JSON, subroutes included.

// guardRoute is a route as the check reads it.
type guardRoute struct {
	paths    [][]string // each matcher set's path values; nil for a set without path
	matchAll bool       // no matcher: the route runs for every request
	terminal bool
	handlers []json.RawMessage
}

type guardRawRoute struct {
	Match    []map[string]json.RawMessage `json:"match"`
	Handle   []json.RawMessage            `json:"handle"`
	Terminal bool                         `json:"terminal"`
	Group    string                       `json:"group"`
}

type guardRawHandler struct {
	Handler string          `json:"handler"`
	Routes  []guardRawRoute `json:"routes"`
	Name    string          `json:"name"` // invoke's named route
	Errors  *struct {
		Routes []guardRawRoute `json:"routes"`
	} `json:"errors"` // a subroute's error routes
}

// openPath is one finding: the matcher of a sangho_dedup route and a
// path that a later route proxies unchecked.
type openPath struct {
	matcher, path string
}

func rawGuardRoutes(rs []guardRawRoute) []guardRoute {
	out := make([]guardRoute, 0, len(rs))
	for _, r := range rs {
		g := guardRoute{matchAll: len(r.Match) == 0, terminal: r.Terminal, handlers: r.Handle}
		for _, set := range r.Match {
			var paths []string
			if raw, ok := set["path"]; ok && json.Unmarshal(raw, &paths) != nil {
				paths = nil
			}
			g.paths = append(g.paths, paths)
		}
		out = append(out, g)
	}
	return out
}

// serverGuardRoutes reads the server's routes: those already loaded
// have no raw handlers left (none holds sangho_dedup when the first
// sangho_dedup handler of the server is provisioned).
func serverGuardRoutes(srv *caddyhttp.Server) []guardRoute {
	out := make([]guardRoute, 0, len(srv.Routes))
	for _, r := range srv.Routes {
		g := guardRoute{terminal: r.Terminal, handlers: r.HandlersRaw}
		if r.MatcherSetsRaw != nil {
			raw, _ := json.Marshal(r.MatcherSetsRaw)
			var rr guardRawRoute
			_ = json.Unmarshal([]byte(`{"match":`+string(raw)+`}`), &rr)
			g.paths, g.matchAll = rawGuardRoutes([]guardRawRoute{rr})[0].paths, len(rr.Match) == 0
		} else {
			g.matchAll = len(r.MatcherSets) == 0
			for _, set := range r.MatcherSets {
				var paths []string
				for _, m := range set {
					switch p := m.(type) {
					case caddyhttp.MatchPath:
						paths = p
					case *caddyhttp.MatchPath:
						paths = *p
					}
				}
				g.paths = append(g.paths, paths)
			}
		}
		out = append(out, g)
	}
	return out
}

// findOpenPaths returns, for each sangho_dedup route of routes (and of
// their subroutes) that has a path matcher, the paths a later route of
// its list proxies unchecked.
func findOpenPaths(routes []guardRoute) []openPath {
	var found []openPath
	for i, r := range routes {
		for _, raw := range r.handlers {
			var h guardRawHandler
			if json.Unmarshal(raw, &h) != nil {
				continue
			}
			switch h.Handler {
			case "sangho_dedup":
				if r.matchAll {
					continue
				}
				if p, ok := unmatchedPath(r.paths); ok && flowRoutes(routes[i+1:]) == flowProxy {
					found = append(found, openPath{matcher: describePaths(r.paths), path: p})
				}
			case "subroute":
				found = append(found, findOpenPaths(rawGuardRoutes(h.Routes))...)
			}
		}
	}
	return found
}

type flow int

const (
	flowThrough flow = iota // on to the next handler
	flowStop                // answered, or checked by sangho_dedup
	flowProxy               // reverse_proxy, unchecked
)

// flowRoutes follows a request that no route matcher of routes matches.
func flowRoutes(routes []guardRoute) flow {
	for _, r := range routes {
		if !r.matchAll {
			continue
		}
		if r.handlers == nil && r.terminal {
			return flowStop
		}
		if f := flowHandlers(r.handlers); f != flowThrough {
			return f
		}
		if r.terminal {
			return flowStop
		}
	}
	return flowThrough
}

func flowHandlers(handlers []json.RawMessage) flow {
	for _, raw := range handlers {
		var h guardRawHandler
		if json.Unmarshal(raw, &h) != nil {
			return flowStop // unreadable: say nothing
		}
		switch h.Handler {
		case "reverse_proxy":
			return flowProxy
		case "sangho_dedup", "static_response", "error", "file_server":
			return flowStop
		case "subroute":
			if f := flowRoutes(rawGuardRoutes(h.Routes)); f != flowThrough {
				return f
			}
		}
	}
	return flowThrough
}

// unmatchedPath returns a path near the matcher's that no matcher set
// matches; false when a set has no path matcher (it may match anything)
// or every candidate matches.
func unmatchedPath(sets [][]string) (string, bool) {
	var candidates []string
	for _, set := range sets {
		if set == nil {
			return "", false
		}
		for _, p := range set {
			p = strings.TrimRight(p, "*")
			candidates = append(candidates, p+"/", p+"/x", p+"x")
		}
	}
	candidates = append(candidates, "/", "/x")
	ctx := context.WithValue(context.Background(), caddy.ReplacerCtxKey, caddy.NewReplacer())
next:
	for _, c := range candidates {
		if !strings.HasPrefix(c, "/") {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+c, nil)
		if err != nil {
			continue
		}
		for _, set := range sets {
			m := caddyhttp.MatchPath(slices.Clone(set))
			if err := m.Provision(caddy.Context{}); err != nil {
				return "", false
			}
			if ok, _ := m.MatchWithError(req); ok {
				continue next
			}
		}
		return c, true
	}
	return "", false
}

func describePaths(sets [][]string) string {
	var parts []string
	for _, set := range sets {
		parts = append(parts, "path "+strings.Join(set, " "))
	}
	return strings.Join(parts, " or ")
}

// warnOpenPaths runs the check for h's server if h is the server's first
// sangho_dedup handler in this config.
func (h *Handler) warnOpenPaths(ctx caddy.Context) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return
	}
	endpoints.Lock()
	cfg := endpoints.byConfig[h.cfgKey]
	first := cfg != nil && !cfg.checked[srv]
	if first {
		if cfg.checked == nil {
			cfg.checked = map[*caddyhttp.Server]bool{}
		}
		cfg.checked[srv] = true
	}
	endpoints.Unlock()
	if !first {
		return
	}
	for _, o := range findOpenPaths(serverGuardRoutes(srv)) {
		h.logger.Warn("path proxied unchecked", zap.String("matcher", o.matcher), zap.String("open_path", o.path),
			zap.Strings("listen", srv.Listen))
	}
	if unreached(srv) {
		h.logger.Warn("sangho_dedup never reached",
			zap.Strings("listen", srv.Listen),
			zap.String("why", "a handler before it in its route answers every request (reverse_proxy without handle_response, respond, error, file_server without pass_thru): deliveries reach the backend unsigned and as often as they are sent"),
			zap.String("instead", "put sangho_dedup before the backend's handler: in a route { } block, first; and no global order option that moves it after reverse_proxy"))
	}
	if resendingProxy(srv) {
		h.logger.Warn("reverse_proxy may send a delivery twice",
			zap.Strings("listen", srv.Listen),
			zap.String("why", "a reverse_proxy after sangho_dedup has request_buffers, which replays the body, and lb_retry_match with lb_retries or lb_try_duration, which retries a POST after it reached an upstream: the next upstream may process an event the first one processed, inside one delivery, where sangho_dedup cannot mark it"),
			zap.String("instead", "drop lb_retry_match (reverse_proxy still retries dial errors, which never reached an upstream), or request_buffers"))
	}
	if errorRoutesProxy(srv) {
		h.logger.Warn("error routes get no event body",
			zap.Strings("listen", srv.Listen),
			zap.String("why", "the server's handle_errors routes hold reverse_proxy (or php_fastcgi): a delivery that sangho_dedup refuses, or releases or holds after its backend failed, reaches them without its body, so a fallback there gets an empty request"),
			zap.String("instead", "list a fallback backend as a second upstream of the reverse_proxy after sangho_dedup (lb_policy first)"))
	}
}

// resendingProxy reports whether a reverse_proxy that a delivery reaches
// after a sangho_dedup handler (later in its route list, in subroutes
// and the named routes they invoke too) can send it again after it
// reached an upstream: its body is buffered (request_buffers, or the
// fastcgi transport, which buffers small bodies itself), and
// lb_retry_match with retries retries a request after a transport error
// (or a response it matches), not only after a dial error. The next
// upstream may then process an event the first one processed, inside one
// delivery, where no mark can reach it. Caddy accepts that config; the
// handler warns (see warnOpenPaths).
//
// A route of the same group as the one that held sangho_dedup (handle
// blocks) is never reached after it, nor is anything after a terminal
// one (a site) or after a handler that answers (reverse_proxy without
// handle_response, respond, error, file_server without pass_thru):
// none counts. Named routes are walked too, each from its start. What
// Caddy provisioned already has no raw JSON left and is not seen: the
// server's routes, when the first sangho_dedup is in a named route
// (Caddy provisions those last), so a proxy that follows an invoke of
// it there goes unseen.
func resendingProxy(srv *caddyhttp.Server) bool {
	// walkRoutes and walkHandlers report whether a resending proxy is
	// reached after sangho_dedup (after: a delivery that passed one
	// enters), and open: whether such a delivery may go on past their
	// end (a handler that answers ends it).
	var walkRoutes func(routes []resendRoute, after bool, depth int) (found, open bool)
	walkHandlers := func(handlers []json.RawMessage, after bool, depth int) (found, open bool) {
		for _, raw := range handlers {
			var h resendHandler
			if json.Unmarshal(raw, &h) != nil {
				continue
			}
			var sub []resendRoute
			switch h.Handler {
			case "sangho_dedup":
				after = true
				continue
			case "reverse_proxy", "static_response", "error", "file_server":
				if after && h.Handler == "reverse_proxy" && h.resends() {
					return true, true
				}
				if h.answers() {
					after = false
				}
				continue
			case "invoke":
				if r, ok := srv.NamedRoutes[h.Name]; ok && r != nil {
					sub = []resendRoute{{matchAll: true, handlers: r.HandlersRaw}}
				}
			}
			sub = append(sub, subRoutes(h.Routes)...)
			if len(sub) == 0 {
				continue
			}
			f, o := walkRoutes(sub, after, depth+1)
			if f {
				return true, true
			}
			after = o
		}
		return false, after
	}
	walkRoutes = func(routes []resendRoute, after bool, depth int) (found, open bool) {
		if depth > 8 { // a named route that invokes itself
			return false, false
		}
		carry, group := after, "" // group: of the route that let a delivery past sangho_dedup
		for _, r := range routes {
			in := carry
			if group != "" && r.group == group {
				in = after // exclusive with that route: reached only by deliveries that did not run it
			}
			f, o := walkHandlers(r.handlers, in, depth)
			if f {
				return true, true
			}
			switch {
			case r.matchAll && r.terminal:
				carry = false // nothing after it runs
			case r.matchAll:
				carry = o
			case o && !r.terminal:
				carry = true // a delivery it matched goes on, as one it did not
			}
			if o && !in {
				group = r.group
			}
		}
		return false, carry
	}
	if f, _ := walkRoutes(serverRoutes(srv), false, 0); f {
		return true
	}
	for _, r := range srv.NamedRoutes {
		if r != nil {
			if f, _ := walkRoutes([]resendRoute{{matchAll: true, handlers: r.HandlersRaw}}, false, 1); f {
				return true
			}
		}
	}
	return false
}

// unreached reports whether a sangho_dedup of srv's routes (those with
// raw JSON left, see resendingProxy) comes after a handler that answers
// every request that reaches it: a handler of its own route before it,
// or a route of its list before it that matches every request and
// whose handlers answer. A route with a matcher or a group (handle
// blocks, exclusive) may let requests by, and a subroute's answer is
// not followed: both can only hide a finding, never make one up.
func unreached(srv *caddyhttp.Server) bool {
	var walk func(routes []resendRoute, depth int) bool
	walk = func(routes []resendRoute, depth int) bool {
		if depth > 8 {
			return false
		}
		closed := false // a route before answered every request
		for _, r := range routes {
			for _, raw := range r.handlers {
				var h resendHandler
				if json.Unmarshal(raw, &h) != nil {
					break
				}
				if h.Handler == "sangho_dedup" && closed {
					return true
				}
				closed = closed || r.matchAll && r.group == "" && h.answers()
				if !closed && walk(subRoutes(h.Routes), depth+1) {
					return true
				}
			}
		}
		return false
	}
	return walk(serverRoutes(srv), 0)
}

// serverRoutes reads srv's routes as resendingProxy and unreached walk
// them (raw handlers: none left in those Caddy provisioned already).
func serverRoutes(srv *caddyhttp.Server) []resendRoute {
	routes := make([]resendRoute, 0, len(srv.Routes))
	for _, r := range srv.Routes {
		routes = append(routes, resendRoute{group: r.Group, terminal: r.Terminal,
			matchAll: len(r.MatcherSets) == 0 && len(r.MatcherSetsRaw) == 0, handlers: r.HandlersRaw})
	}
	return routes
}

// subRoutes reads a subroute's raw routes.
func subRoutes(rs []guardRawRoute) []resendRoute {
	routes := make([]resendRoute, 0, len(rs))
	for _, r := range rs {
		routes = append(routes, resendRoute{group: r.Group, terminal: r.Terminal, matchAll: len(r.Match) == 0, handlers: r.Handle})
	}
	return routes
}

// answers reports whether the handler h answers every request it gets,
// so that nothing after it in its route runs: reverse_proxy without
// handle_response (whose routes may go on), respond, error, file_server
// without pass_thru.
func (h resendHandler) answers() bool {
	switch h.Handler {
	case "reverse_proxy":
		return len(h.HandleResponse) == 0
	case "static_response", "error":
		return true
	case "file_server":
		return !h.PassThru
	}
	return false
}

// resendRoute is a route as resendingProxy reads it.
type resendRoute struct {
	group    string
	terminal bool
	matchAll bool // no matcher: every request runs it
	handlers []json.RawMessage
}

// resendHandler is a handler as resendingProxy reads it.
type resendHandler struct {
	guardRawHandler
	RequestBuffers int64             `json:"request_buffers"`
	HandleResponse []json.RawMessage `json:"handle_response"`
	PassThru       bool              `json:"pass_thru"` // file_server
	Transport      *struct {
		Protocol string `json:"protocol"`
	} `json:"transport"`
	LoadBalancing *struct {
		Retries     int               `json:"retries"`
		TryDuration caddy.Duration    `json:"try_duration"`
		RetryMatch  []json.RawMessage `json:"retry_match"`
	} `json:"load_balancing"`
}

// resends reports whether the reverse_proxy h can send a request again
// after it reached an upstream: a buffered body (the fastcgi transport
// buffers one of up to 4 KiB by itself), and retries that lb_retry_match
// allows after transport errors or responses.
func (h resendHandler) resends() bool {
	buffered := h.RequestBuffers != 0 || h.Transport != nil && h.Transport.Protocol == "fastcgi"
	lb := h.LoadBalancing
	return buffered && lb != nil && slices.ContainsFunc(lb.RetryMatch, matchesPost) && (lb.Retries > 0 || lb.TryDuration > 0)
}

// matchesPost reports whether the lb_retry_match matcher set may match a
// delivery, a POST: any set but one whose method matcher leaves POST out
// (the other matchers are not evaluated: they may match).
func matchesPost(set json.RawMessage) bool {
	var m struct {
		Method []string `json:"method"`
	}
	if json.Unmarshal(set, &m) != nil || m.Method == nil {
		return true
	}
	return slices.ContainsFunc(m.Method, func(v string) bool { return strings.EqualFold(v, http.MethodPost) })
}

// errorRoutesProxy reports whether error routes that can get a
// sangho_dedup error hold a reverse_proxy (php_fastcgi is one), in
// subroutes and the named routes they invoke too: the server's, and
// those of a subroute (JSON's "errors") that holds sangho_dedup. They
// are still raw JSON here: Caddy provisions a server's error routes,
// and then its named routes, after its routes, and a route's raw
// handlers are dropped only once they are all provisioned (see
// ServeHTTP for what error routes get).
func errorRoutesProxy(srv *caddyhttp.Server) bool {
	// anyHandler reports whether one of handlers, or of the subroutes
	// and named routes they hold, is one that is reports true for
	// (anyRoute: of routes' handlers).
	var anyHandler func(handlers []json.RawMessage, depth int, is func(guardRawHandler) bool) bool
	anyHandler = func(handlers []json.RawMessage, depth int, is func(guardRawHandler) bool) bool {
		if depth > 8 { // a named route that invokes itself
			return false
		}
		for _, raw := range handlers {
			var h guardRawHandler
			if json.Unmarshal(raw, &h) != nil {
				continue
			}
			if is(h) {
				return true
			}
			if h.Handler == "invoke" {
				if r, ok := srv.NamedRoutes[h.Name]; ok && r != nil && anyHandler(r.HandlersRaw, depth+1, is) {
					return true
				}
			}
			for _, r := range h.Routes {
				if anyHandler(r.Handle, depth+1, is) {
					return true
				}
			}
		}
		return false
	}
	anyRoute := func(routes []guardRawRoute, is func(guardRawHandler) bool) bool {
		return slices.ContainsFunc(routes, func(r guardRawRoute) bool { return anyHandler(r.Handle, 0, is) })
	}
	isProxy := func(h guardRawHandler) bool { return h.Handler == "reverse_proxy" }
	isDedup := func(h guardRawHandler) bool { return h.Handler == "sangho_dedup" }
	// A subroute that holds sangho_dedup and whose error routes proxy.
	guardedSubroute := func(h guardRawHandler) bool {
		return h.Errors != nil && anyRoute(h.Errors.Routes, isProxy) && anyRoute(h.Routes, isDedup)
	}
	for _, r := range srv.Routes {
		if anyHandler(r.HandlersRaw, 0, guardedSubroute) {
			return true
		}
	}
	if srv.Errors == nil {
		return false
	}
	for _, r := range srv.Errors.Routes {
		if anyHandler(r.HandlersRaw, 0, isProxy) {
			return true
		}
	}
	return false
}
