package sanghodedup

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Tracing: when Caddy's tracing handler (the tracing directive) runs
// before this one, the request's span carries what the handler decided.
// Nothing is done when the span is not recording (no tracing, or not
// sampled): then the cost is one context look-up.
//
// Attributes: messaging.message.id (OpenTelemetry's messaging
// conventions: the sender's ID of the message) is the event ID; the
// rest, which no convention covers, are in the sangho_dedup namespace.
const (
	attrEventID   = "messaging.message.id"
	attrEventType = "sangho_dedup.event_type"
	attrOutcome   = "sangho_dedup.outcome"
	attrProvider  = "sangho_dedup.provider"
	attrStore     = "sangho_dedup.store"
	attrEndpoint  = "sangho_dedup.endpoint"
	// "unknown" when the delivery was passed on marked (headerPriorAttempt)
	attrPriorAttempt = "sangho_dedup.prior_attempt"
	// span events, when the event is released or held (see settle)
	spanEventReleased = "sangho_dedup.event_released"
	spanEventHeld     = "sangho_dedup.event_held"
)

// annotateSpan sets the attributes of the request's span from the
// placeholders the handler set; deferred by ServeHTTP when the span is
// recording.
func (h *Handler) annotateSpan(span trace.Span, repl *caddy.Replacer) {
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, attribute.String(attrProvider, h.provider.name), attribute.String(attrEndpoint, h.Name))
	if m, ok := h.store.(caddy.Module); ok {
		attrs = append(attrs, attribute.String(attrStore, m.CaddyModule().ID.Name()))
	}
	for _, p := range [...]struct{ attr, placeholder string }{
		{attrEventID, "http.sangho_dedup.event_id"},
		{attrEventType, "http.sangho_dedup.event_type"},
		{attrOutcome, "http.sangho_dedup.outcome"},
		{attrPriorAttempt, "http.sangho_dedup.prior_attempt"},
	} {
		if v, _ := repl.GetString(p.placeholder); v != "" {
			attrs = append(attrs, attribute.String(p.attr, v))
		}
	}
	span.SetAttributes(attrs...)
}

// spanEvent adds a span event to the request's span when it is
// recording: the status the next handler wrote (0: none) and the error
// it returned.
func spanEvent(ctx context.Context, name string, status int, cause error, lockTTL time.Duration) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 3)
	if status != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", status))
	}
	if cause != nil {
		attrs = append(attrs, attribute.String("sangho_dedup.cause", cause.Error()))
	}
	if lockTTL > 0 {
		attrs = append(attrs, attribute.String("sangho_dedup.lock_ttl", lockTTL.String()))
	}
	span.AddEvent(name, trace.WithAttributes(attrs...))
}
