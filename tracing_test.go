package sanghodedup

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestSpanCarriesEvent: with a recording span in the request's context
// (what Caddy's tracing handler puts there), the span gets the event ID,
// outcome, provider, store and endpoint, and a released or held event
// adds a span event. Spans go to an in-memory exporter.
func TestSpanCarriesEvent(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")
	h, _ := newTestHandler(t, func(h *Handler) { h.Name = "payments" })

	failing := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusInternalServerError)
		return nil
	}}
	timeout := &countingNext{serve: func(w http.ResponseWriter, r *http.Request) error {
		return errors.New("backend timeout") // no status: unknown fate
	}}
	cases := []struct {
		name, id, outcome, spanEvent string
		req                          *http.Request
		next                         *countingNext
	}{
		{"processed", "evt_trace_1", outcomeProcessed, "", signedRequest(eventBody("evt_trace_1"), ""), &countingNext{}},
		{"duplicate", "evt_trace_1", outcomeDuplicate, "", signedRequest(eventBody("evt_trace_1"), ""), &countingNext{}},
		{"released", "evt_trace_2", outcomeReleased, spanEventReleased, signedRequest(eventBody("evt_trace_2"), ""), failing},
		{"held", "evt_trace_3", outcomeHeld, spanEventHeld, signedRequest(eventBody("evt_trace_3"), ""), timeout},
		{"invalid signature", "", outcomeInvalidSignature, "", signedRequest(eventBody("evt_trace_4"), "", secret2), &countingNext{}},
	}
	for _, c := range cases {
		exp.Reset()
		ctx, span := tracer.Start(context.Background(), "handler")
		_, repl, _ := serve(h, c.req.WithContext(ctx), c.next)
		span.End()
		if outcomeOf(repl) != c.outcome {
			t.Fatalf("%s: outcome %q, want %q", c.name, outcomeOf(repl), c.outcome)
		}
		spans := exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%s: %d spans exported, want 1", c.name, len(spans))
		}
		got := map[attribute.Key]string{}
		for _, kv := range spans[0].Attributes {
			got[kv.Key] = kv.Value.String()
		}
		want := map[attribute.Key]string{
			"sangho_dedup.outcome": c.outcome, "sangho_dedup.provider": "sangho",
			"sangho_dedup.store": "memory", "sangho_dedup.endpoint": "payments",
		}
		if c.id != "" {
			want["messaging.message.id"] = c.id
			want["sangho_dedup.event_type"] = "payment_intent.succeeded"
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: attribute %s = %q, want %q (all: %v)", c.name, k, got[k], v, got)
			}
		}
		if c.id == "" && got["messaging.message.id"] != "" {
			t.Errorf("%s: an event ID on a rejected delivery that had none: %v", c.name, got)
		}
		var events []string
		for _, e := range spans[0].Events {
			events = append(events, e.Name)
			if e.Name == spanEventHeld {
				if a := eventAttr(e, "sangho_dedup.lock_ttl"); a != "30s" {
					t.Errorf("held event: lock_ttl %q, want 30s", a)
				}
				if a := eventAttr(e, "sangho_dedup.cause"); a != "backend timeout" {
					t.Errorf("held event: cause %q", a)
				}
			}
			if e.Name == spanEventReleased {
				if a := eventAttr(e, "http.response.status_code"); a != "500" {
					t.Errorf("released event: status %q, want 500", a)
				}
			}
		}
		if c.spanEvent == "" && len(events) != 0 || c.spanEvent != "" && (len(events) != 1 || events[0] != c.spanEvent) {
			t.Errorf("%s: span events %v, want [%s]", c.name, events, c.spanEvent)
		}
	}

	// A span that does not record (tracing off, or not sampled) gets
	// nothing and costs nothing: the handler works as without one.
	ctx, span := noop.NewTracerProvider().Tracer("off").Start(context.Background(), "handler")
	if span.IsRecording() {
		t.Fatal("noop span records")
	}
	if _, repl, _ := serve(h, signedRequest(eventBody("evt_trace_5"), "").WithContext(ctx), &countingNext{}); outcomeOf(repl) != outcomeProcessed {
		t.Fatalf("without a recording span: outcome %q", outcomeOf(repl))
	}
}

func eventAttr(e sdktrace.Event, key attribute.Key) string {
	for _, kv := range e.Attributes {
		if kv.Key == key {
			return kv.Value.String()
		}
	}
	return ""
}
