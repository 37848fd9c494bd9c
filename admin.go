package sanghodedup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is the admin API of sangho_dedup, on Caddy's admin endpoint
// (so its security applies: loopback or a unix socket by default,
// `origins`, remote admin with mTLS). Routes, JSON in and out:
//
//	GET    /sangho_dedup/                          the endpoints of the running config
//	GET    /sangho_dedup/<name>/events/<id>        what the store holds for an event
//	DELETE /sangho_dedup/<name>/events/<id>[?force=true]
//	                                               forget a processed event, so that its next
//	                                               delivery is processed; force also removes
//	                                               the lease of an event in flight (dangerous)
//
// <name> is a handler's `name` (default: its key_prefix without the
// trailing colon, "sangho_dedup"), URL-escaped; the key_prefix itself,
// its default name before, still reaches an endpoint named by default.
type AdminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.sangho_dedup",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Provision keeps the logger, named for this module: Caddy makes admin
// routers without loading them into the context, whose ctx.Logger()
// would be the unnamed default logger. (Caddy's own caddypki admin API
// does the same, caddy issue #5032.)
func (a *AdminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger(a)
	return nil
}

// Routes implements caddy.AdminRouter.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/sangho_dedup/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// EndpointInfo is one item of GET /sangho_dedup/.
type EndpointInfo struct {
	Name      string `json:"name"`
	Store     string `json:"store"`
	KeyPrefix string `json:"key_prefix"`
}

// EventInfo is the answer of GET and DELETE /sangho_dedup/<name>/events/<id>.
type EventInfo struct {
	// Endpoint is the name of the endpoint that answered: the one asked
	// for, or the endpoint an earlier name of it reached.
	Endpoint    string     `json:"endpoint"`
	ID          string     `json:"id"`
	State       string     `json:"state"` // done, in_flight, unknown (a mark: see dedup.MarkFor) or absent
	ProcessedAt *time.Time `json:"processed_at,omitempty"`
	EventType   string     `json:"event_type,omitempty"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	Fingerprint string     `json:"fingerprint,omitempty"`
}

func eventInfo(endpoint, id string, e dedup.Entry) EventInfo {
	info := EventInfo{Endpoint: endpoint, ID: id, State: e.State()}
	if !e.ExpiresAt.IsZero() {
		exp := e.ExpiresAt.UTC().Round(time.Millisecond)
		info.ExpiresAt = &exp
	}
	if rec, ok := dedup.DecodeDone(e.Value); ok {
		at := rec.ProcessedAt.UTC()
		info.ProcessedAt, info.EventType, info.Fingerprint = &at, cleanEventType(rec.EventType), rec.Fingerprint
	}
	return info
}

func apiError(status int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

func (a *AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	rest := strings.TrimPrefix(r.URL.EscapedPath(), "/sangho_dedup/")
	if rest == "" {
		if r.Method != http.MethodGet {
			return apiError(http.StatusMethodNotAllowed, "method %s not allowed: GET lists the endpoints", r.Method)
		}
		return writeJSON(w, http.StatusOK, listEndpoints())
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[1] != "events" {
		return apiError(http.StatusNotFound, "no such route: use /sangho_dedup/<name>/events/<id>")
	}
	name, err1 := url.PathUnescape(parts[0])
	id, err2 := url.PathUnescape(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		return apiError(http.StatusBadRequest, "malformed path: %v", err)
	}
	h, ok := endpointNamed(name)
	if !ok {
		return apiError(http.StatusNotFound, "no sangho_dedup endpoint named %q in the running config (GET /sangho_dedup/ lists them)", name)
	}
	if !validID(id) {
		return apiError(http.StatusBadRequest, "%q is not an event ID: 1 to 255 characters of A-Z a-z 0-9 _ -", id)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	key := h.KeyPrefix + id
	switch r.Method {
	case http.MethodGet:
		e, err := h.store.Get(ctx, key)
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "looking up %q: %v", id, err)
		}
		status := http.StatusOK
		if e.Value == "" {
			status = http.StatusNotFound
		}
		return writeJSON(w, status, eventInfo(h.Name, id, e))
	case http.MethodDelete:
		force := r.URL.Query().Get("force") == "true"
		e, deleted, err := h.forget(ctx, key, force)
		if err != nil {
			return apiError(http.StatusServiceUnavailable, "forgetting %q: %v", id, err)
		}
		info := eventInfo(h.Name, id, e)
		switch {
		case e.Value == "":
			return writeJSON(w, http.StatusNotFound, info)
		case !deleted && info.State == "unknown":
			return apiError(http.StatusConflict, "event %q holds the mark of an attempt whose fate is unknown (its lease ran out before it was settled: its Caddy died, or it was held): not forgotten; ?force=true removes the mark, and its next delivery then reaches the backend unmarked", id)
		case !deleted:
			return apiError(http.StatusConflict, "event %q is in flight (a delivery holds its lease: a backend working on it, or a held attempt): not forgotten; ?force=true removes its lease too, and a redelivery may then be processed while the backend still works", id)
		}
		a.logger.Info("event forgotten", zap.String("name", h.Name), zap.String("event_id", id),
			zap.String("state", info.State), zap.Bool("force", force))
		return writeJSON(w, http.StatusOK, info)
	}
	return apiError(http.StatusMethodNotAllowed, "method %s not allowed: GET or DELETE", r.Method)
}

// endpointNamed returns the running config's handler named name. The
// key_prefix of an endpoint named by default reaches it too: that was
// its name ("sangho_dedup:") before the trailing colon was dropped, and
// scripts written against it keep working.
func endpointNamed(name string) (*Handler, bool) {
	eps := currentEndpoints()
	if h, ok := eps[name]; ok {
		return h, true
	}
	for _, h := range eps {
		if h.KeyPrefix == name && h.Name == defaultName(h.KeyPrefix) {
			return h, true
		}
	}
	return nil, false
}

func listEndpoints() []EndpointInfo {
	list := []EndpointInfo{}
	for name, h := range currentEndpoints() {
		store := "unknown"
		if m, ok := h.store.(caddy.Module); ok {
			store = m.CaddyModule().ID.Name()
		}
		list = append(list, EndpointInfo{Name: name, Store: store, KeyPrefix: h.KeyPrefix})
	}
	slices.SortFunc(list, func(a, b EndpointInfo) int { return strings.Compare(a.Name, b.Name) })
	return list
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*AdminAPI)(nil)
	_ caddy.Provisioner = (*AdminAPI)(nil)
)
