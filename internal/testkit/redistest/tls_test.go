package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestStartTLS: the TLS server answers a client with the CA and the
// client certificate, and refuses one without the certificate.
func TestStartTLS(t *testing.T) {
	files := GenerateTLS(t)
	s := StartTLS(t, files, true)
	ctx := context.Background()
	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Fatalf("ping over TLS with a client certificate: %v", err)
	}
	cfg := files.ClientConfig(t)
	cfg.Certificates = nil
	c := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: cfg, MaxRetries: -1, DialTimeout: 2 * time.Second})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("ping without a client certificate succeeded on a server with --tls-auth-clients yes")
	}
}
