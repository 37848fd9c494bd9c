package load

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func TestBodySize(t *testing.T) {
	for _, size := range []int{200, 1024, 64 << 10} {
		b := Body("evt_1", "x.y", size)
		if len(b) < size-16 || len(b) > size+16 {
			t.Errorf("Body(%d) is %d bytes", size, len(b))
		}
		var v struct{ ID, Type string }
		if err := json.Unmarshal(b, &v); err != nil || v.ID != "evt_1" || v.Type != "x.y" {
			t.Errorf("Body(%d) = %v %+v", size, err, v)
		}
	}
}

// TestRunCountsAndDuplicates runs load against a server that answers
// like sangho_dedup (duplicates marked) and checks the report's counts.
func TestRunCountsAndDuplicates(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Sangho-Event-ID")
		if r.Header.Get("Sangho-Signature") == "" {
			w.WriteHeader(401)
			return
		}
		mu.Lock()
		dup := seen[id]
		seen[id] = true
		mu.Unlock()
		if dup {
			w.Header().Set("Sangho-Dedup", "duplicate")
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 4, Events: 400, Duplicates: 0.5, BodySize: 300, Warmup: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 400 || res.ByStatus["200"] != 400 {
		t.Fatalf("requests %d, statuses %v", res.Requests, res.ByStatus)
	}
	if res.NewSent+res.DupSent != 400 || res.DupSent < 120 || res.DupSent > 280 {
		t.Fatalf("new %d, redeliveries %d: not about half", res.NewSent, res.DupSent)
	}
	if res.ByDedup["duplicate"] != res.DupSent {
		t.Fatalf("server saw %d duplicates, load sent %d", res.ByDedup["duplicate"], res.DupSent)
	}
	if !(res.P50 <= res.P90 && res.P90 <= res.P99 && res.P99 <= res.Max) {
		t.Fatalf("quantiles out of order: %+v", res)
	}
}

func TestRunAtARate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{URL: srv.URL, Secret: "s", Concurrency: 4, Duration: time.Second, Rate: 100, BodySize: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests < 80 || res.Requests > 110 {
		t.Fatalf("%d requests in 1 s at 100/s", res.Requests)
	}
}
