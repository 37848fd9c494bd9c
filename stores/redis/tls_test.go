package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/sangho/caddy-sangho-dedup/internal/testkit/redistest"
)

// tlsStore parses a `store redis` block as a user writes it, provisions
// it (Caddy's CA pool modules load as in a real config) and runs one
// claim. It returns the claim's error and the store's load-time logs.
func tlsStore(t *testing.T, block string) (*observer.ObservedLogs, error) {
	t.Helper()
	s, err := parseRedisStore(t, block+"\ndial_timeout 2s")
	if err != nil {
		t.Fatalf("%s: %v", block, err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	s.logger = zap.New(core)
	st := provisionRedisStore(t, &s)
	_, _, err = st.Claim(context.Background(), testKeyPrefix+"evt_tls", newToken(), time.Minute)
	return logs, err
}

// TestRedisTLS runs the TLS options against a real redis-server that
// speaks TLS only and requires a client certificate, with certificates
// made by the test: a trusted CA pool and a client certificate work;
// an unknown CA, a wrong server name, no client certificate or one from
// another CA fail.
func TestRedisTLS(t *testing.T) {
	files := redistest.GenerateTLS(t)
	srv := redistest.StartTLS(t, files, true)
	addr := "address " + srv.Addr
	auth := "tls_client_auth " + files.ClientCert + " " + files.ClientKey
	name := "tls_server_name " + redistest.TLSServerName
	for _, c := range []struct {
		name, block string
		ok          bool
		fail        string // in the error
	}{
		{"trusted CA, client certificate", addr + "\ntls_trust_pool file " + files.CA + "\n" + auth + "\n" + name, true, ""},
		{"trust pool in a block", addr + "\ntls_trust_pool file {\npem_file " + files.CA + "\n}\n" + auth + "\n" + name, true, ""},
		{"rediss url", "url rediss://" + srv.Addr + "\ntls_trust_pool file " + files.CA + "\n" + auth + "\n" + name, true, ""},
		{"skip verify (unknown CA)", addr + "\ntls_insecure_skip_verify\n" + auth, true, ""},
		{"rediss url, skip_verify", "url rediss://" + srv.Addr + "?skip_verify=true\n" + auth, true, ""},
		{"unknown CA", addr + "\ntls_trust_pool file " + files.OtherCA + "\n" + auth + "\n" + name, false, "certificate signed by unknown authority"},
		{"system roots only", addr + "\ntls\n" + auth + "\n" + name, false, "certificate signed by unknown authority"},
		{"no server name (the certificate is for redis.test, not 127.0.0.1)", addr + "\ntls_trust_pool file " + files.CA + "\n" + auth, false, "127.0.0.1"},
		{"wrong server name", addr + "\ntls_trust_pool file " + files.CA + "\n" + auth + "\ntls_server_name other.test", false, "other.test"},
		{"no client certificate", addr + "\ntls_trust_pool file " + files.CA + "\n" + name, false, "tls: certificate required"},
		{"client certificate of another CA", addr + "\ntls_trust_pool file " + files.CA + "\ntls_client_auth " + files.OtherClientCert + " " + files.OtherClientKey + "\n" + name, false, "tls: unknown certificate authority"},
	} {
		_, err := tlsStore(t, c.block)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case !c.ok && err == nil:
			t.Errorf("%s: claim succeeded", c.name)
		case !c.ok && !strings.Contains(err.Error(), c.fail):
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.fail)
		}
	}
	if n := len(srv.Client(t).Keys(context.Background(), testKeyPrefix+"evt_tls").Val()); n != 1 {
		t.Fatalf("%d keys written over TLS", n)
	}
}

// TestRedisTLSNoClientAuth: a server that asks for no client certificate
// works with the trust pool alone.
func TestRedisTLSNoClientAuth(t *testing.T) {
	files := redistest.GenerateTLS(t)
	srv := redistest.StartTLS(t, files, false)
	if _, err := tlsStore(t, "address "+srv.Addr+"\ntls_trust_pool file "+files.CA+"\ntls_server_name "+redistest.TLSServerName); err != nil {
		t.Fatal(err)
	}
}

// TestRedisTLSInsecureWarned: tls_insecure_skip_verify, and skip_verify
// in a rediss:// url, are warned at load.
func TestRedisTLSInsecureWarned(t *testing.T) {
	files := redistest.GenerateTLS(t)
	srv := redistest.StartTLS(t, files, false)
	const warn = "redis TLS certificate not verified"
	for _, block := range []string{"address " + srv.Addr + "\ntls_insecure_skip_verify", "url rediss://" + srv.Addr + "?skip_verify=true"} {
		logs, err := tlsStore(t, block)
		if err != nil {
			t.Fatal(err)
		}
		if e := logs.FilterMessage(warn).All(); len(e) != 1 || e[0].Level != zapcore.WarnLevel {
			t.Errorf("%q: logs %v; want one warning", block, logs.All())
		}
	}
	logs, err := tlsStore(t, "address "+srv.Addr+"\ntls_trust_pool file "+files.CA+"\ntls_server_name "+redistest.TLSServerName)
	if err != nil || logs.FilterMessage(warn).Len() != 0 {
		t.Errorf("verified TLS: %v, logs %v", err, logs.All())
	}
}

// TestRedisTLSConfigErrors: TLS settings that cannot load are config
// errors naming the option, without the key's content.
func TestRedisTLSConfigErrors(t *testing.T) {
	files := redistest.GenerateTLS(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, c := range []struct {
		s    Store
		want string
	}{
		{Store{TLSClientCertificateFile: files.ClientCert}, "tls_client_auth: needs both a certificate file and a key file"},
		{Store{TLSClientCertificateFile: "/nonexistent/c.pem", TLSClientCertificateKeyFile: files.ClientKey}, "tls_client_auth: loading the certificate and key"},
		{Store{TLSClientCertificateFile: files.ClientCert, TLSClientCertificateKeyFile: files.OtherClientKey}, "tls_client_auth: loading the certificate and key"},
		{Store{TLSTrustPoolRaw: []byte(`{"provider":"file","pem_files":["/nonexistent/ca.pem"]}`)}, "tls_trust_pool"},
		{Store{TLSTrustPoolRaw: []byte(`{"provider":"nosuch"}`)}, "tls_trust_pool"},
	} {
		s := c.s
		err := s.Provision(ctx)
		if err == nil {
			s.Cleanup()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to contain %q", c.s, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("the error shows key material: %v", err)
		}
	}
}
