package sanghodedup

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	redisstore "github.com/sangho/caddy-sangho-dedup/stores/redis"
)

func TestUnmarshalCaddyfileEveryOption(t *testing.T) {
	d := caddyfile.NewTestDispenser(`sangho_dedup {
		secret whsec_old whsec_new
		secret {env.SANGHO_WEBHOOK_SECRET}
		tolerance 2m
		max_body_size 512KB
		event_id_header X-Event
		signature_header X-Sig
		retention 96h
		lock_ttl 45s
		retry_after 3s
		on_store_error pass
		key_prefix tenant_a:
		require_body_id off
		store redis {
			address 10.0.0.1:6379 10.0.0.2:6379
			address 10.0.0.3:6379
			master_name mymaster
			username app
			password {env.REDIS_PASSWORD}
			db 2
			tls
			dial_timeout 1s
			read_timeout 2s
			write_timeout 4s
			pool_size 20
			disable_pipeline
		}
	}`)
	var h Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	off := false
	want := Handler{
		RequireBodyID:   &off,
		Secrets:         []string{"whsec_old", "whsec_new", "{env.SANGHO_WEBHOOK_SECRET}"},
		Tolerance:       caddy.Duration(2 * time.Minute),
		MaxBodySize:     512000,
		EventIDHeader:   "X-Event",
		SignatureHeader: "X-Sig",
		Retention:       caddy.Duration(96 * time.Hour),
		LockTTL:         caddy.Duration(45 * time.Second),
		RetryAfter:      caddy.Duration(3 * time.Second),
		OnStoreError:    "pass",
		KeyPrefix:       "tenant_a:",
	}
	store := h.StoreRaw
	h.StoreRaw = nil
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("got  %+v\nwant %+v", h, want)
	}
	// As Caddy loads it: its inline key "type" taken out first.
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(store, &obj); err != nil {
		t.Fatal(err)
	}
	var rs struct {
		Type  string
		Store redisstore.Store
	}
	_ = json.Unmarshal(obj["type"], &rs.Type)
	delete(obj, "type")
	if b, _ := json.Marshal(obj); json.Unmarshal(b, &rs.Store) != nil {
		t.Fatalf("store: %s", b)
	}
	wantStore := redisstore.Store{
		Address:    []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"},
		MasterName: "mymaster", Username: "app", Password: "{env.REDIS_PASSWORD}", DB: 2, TLS: true,
		DialTimeout: caddy.Duration(time.Second), ReadTimeout: caddy.Duration(2 * time.Second),
		WriteTimeout: caddy.Duration(4 * time.Second), PoolSize: 20, DisablePipeline: true,
	}
	if rs.Type != "redis" || !reflect.DeepEqual(rs.Store, wantStore) {
		t.Fatalf("store %s: got %+v\nwant %+v", rs.Type, rs.Store, wantStore)
	}
}

func TestUnmarshalCaddyfileSizes(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "512KB": 512000, "1MiB": 1 << 20, "1048576": 1 << 20, "64KiB": 65536, "2mb": 2000000} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\nmax_body_size " + in + "\n}"))
		if err != nil || h.MaxBodySize != want {
			t.Errorf("max_body_size %s = %d, %v; want %d", in, h.MaxBodySize, err, want)
		}
	}
}

func TestUnmarshalCaddyfileRequireBodyID(t *testing.T) {
	for in, want := range map[string]*bool{"": nil, "require_body_id on": new(true), "require_body_id off": new(false)} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}"))
		if err != nil || !reflect.DeepEqual(h.RequireBodyID, want) {
			t.Errorf("%q: %v, %v; want %v", in, h.RequireBodyID, err, want)
		}
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	cases := map[string]string{
		"no secret":                  "sangho_dedup {\n}",
		"no block":                   "sangho_dedup",
		"secret without value":       "sangho_dedup {\nsecret\n}",
		"argument on the directive":  "sangho_dedup foo {\nsecret s\n}",
		"unknown subdirective":       "sangho_dedup {\nsecret s\nfrobnicate 1\n}",
		"tolerance twice":            "sangho_dedup {\nsecret s\ntolerance 1m\ntolerance 2m\n}",
		"tolerance missing":          "sangho_dedup {\nsecret s\ntolerance\n}",
		"tolerance two values":       "sangho_dedup {\nsecret s\ntolerance 1m 2m\n}",
		"tolerance bad":              "sangho_dedup {\nsecret s\ntolerance soon\n}",
		"tolerance negative":         "sangho_dedup {\nsecret s\ntolerance -1m\n}",
		"tolerance zero":             "sangho_dedup {\nsecret s\ntolerance 0s\n}",
		"max_body_size bad":          "sangho_dedup {\nsecret s\nmax_body_size lots\n}",
		"max_body_size zero":         "sangho_dedup {\nsecret s\nmax_body_size 0\n}",
		"max_body_size twice":        "sangho_dedup {\nsecret s\nmax_body_size 1MB\nmax_body_size 2MB\n}",
		"event_id_header bad":        "sangho_dedup {\nsecret s\nevent_id_header \"a b\"\n}",
		"signature_header bad":       "sangho_dedup {\nsecret s\nsignature_header a:b\n}",
		"retention bad":              "sangho_dedup {\nsecret s\nretention forever\n}",
		"lock_ttl bad":               "sangho_dedup {\nsecret s\nlock_ttl x\n}",
		"retry_after bad":            "sangho_dedup {\nsecret s\nretry_after x\n}",
		"on_store_error bad":         "sangho_dedup {\nsecret s\non_store_error ignore\n}",
		"on_store_error missing":     "sangho_dedup {\nsecret s\non_store_error\n}",
		"key_prefix missing":         "sangho_dedup {\nsecret s\nkey_prefix\n}",
		"require_body_id missing":    "sangho_dedup {\nsecret s\nrequire_body_id\n}",
		"require_body_id bad":        "sangho_dedup {\nsecret s\nrequire_body_id yes\n}",
		"require_body_id twice":      "sangho_dedup {\nsecret s\nrequire_body_id on\nrequire_body_id off\n}",
		"store missing":              "sangho_dedup {\nsecret s\nstore\n}",
		"store unknown":              "sangho_dedup {\nsecret s\nstore mongodb\n}",
		"store twice":                "sangho_dedup {\nsecret s\nstore memory\nstore memory\n}",
		"store memory with options":  "sangho_dedup {\nsecret s\nstore memory {\nsize 1\n}\n}",
		"store memory with arg":      "sangho_dedup {\nsecret s\nstore memory big\n}",
		"redis unknown option":       "sangho_dedup {\nsecret s\nstore redis {\nhost x\n}\n}",
		"redis address empty":        "sangho_dedup {\nsecret s\nstore redis {\naddress\n}\n}",
		"redis url twice":            "sangho_dedup {\nsecret s\nstore redis {\nurl redis://a\nurl redis://b\n}\n}",
		"redis db bad":               "sangho_dedup {\nsecret s\nstore redis {\ndb one\n}\n}",
		"redis db negative":          "sangho_dedup {\nsecret s\nstore redis {\ndb -1\n}\n}",
		"redis tls with arg":         "sangho_dedup {\nsecret s\nstore redis {\ntls yes\n}\n}",
		"redis pool_size bad":        "sangho_dedup {\nsecret s\nstore redis {\npool_size many\n}\n}",
		"redis timeout bad":          "sangho_dedup {\nsecret s\nstore redis {\nread_timeout x\n}\n}",
		"redis password missing":     "sangho_dedup {\nsecret s\nstore redis {\npassword\n}\n}",
		"redis arg on store line":    "sangho_dedup {\nsecret s\nstore redis 127.0.0.1:6379\n}",
		"redis disable_pipeline arg": "sangho_dedup {\nsecret s\nstore redis {\ndisable_pipeline yes\n}\n}",
		"redis disable_pipeline x2":  "sangho_dedup {\nsecret s\nstore redis {\ndisable_pipeline\ndisable_pipeline\n}\n}",
	}
	for name, in := range cases {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestCaddyfileErrorsNameTheProblem checks a few messages in full.
func TestCaddyfileErrorsNameTheProblem(t *testing.T) {
	for in, want := range map[string]string{
		"sangho_dedup {\nsecret s\nfrobnicate 1\n}":                        `unrecognized sangho_dedup subdirective (not shown: it is no option's name`,
		"sangho_dedup {\nsecret s\nretenton 72h\n}":                        `unrecognized sangho_dedup subdirective (not shown, as it may be a secret; did you mean retention?)`,
		"sangho_dedup {\nsecret s\nlock_tll 1m\n}":                         `unrecognized sangho_dedup subdirective (not shown, as it may be a secret; did you mean lock_ttl?)`,
		"sangho_dedup {\nsecret s\nlock_ttl 1s\nlock_ttl 2s\n}":            "lock_ttl given more than once",
		"sangho_dedup {\n}":                                                "at least one secret is required",
		"sangho_dedup {\nsecret s\ntolerance soon\n}":                      `tolerance: invalid duration "soon"`,
		"sangho_dedup {\nsecret s\non_store_error maybe\n}":                `on_store_error: must be reject or pass, not "maybe"`,
		"sangho_dedup {\nsecret s\nstore redis {\nhost x\n}\n}":            `unrecognized redis store option (not shown`,
		"sangho_dedup {\nsecret s\nstore redis {\nadress x\n}\n}":          `unrecognized redis store option (not shown, as it may be a secret; did you mean address?)`,
		"sangho_dedup {\nsecret s\nstore redis {\nretention 1h\n}\n}":      `unrecognized redis store option "retention"`,
		"sangho_dedup {\nsecret s\nstore redis {\ndb one\n}\n}":            `db: "one" is not a non-negative whole number`,
		"sangho_dedup {\nsecret s\nstore redis {\npipeline off\n}\n}":      "pipeline: the option is now disable_pipeline",
		"sangho_dedup {\nsecret s\nstore redis {\nurl url x\n}\n}":         "url: takes one value, got more",
		"sangho_dedup {\nsecret s\nstore redis {\nurl\n}\n}":               "url has no value",
		"sangho_dedup {\nsecret s\nkey_prefix \"\"\n}":                     `key_prefix: needs a value, not ""`,
		"sangho_dedup {\nsecret s\nname \"\"\n}":                           `name: needs a value, not ""`,
		"sangho_dedup {\nsecret s\nstore file {\npath \"\"\n}\n}":          `path: needs a value, not ""`,
		"sangho_dedup {\nsecret s\nstore redis {\ntls_client_auth c\n}\n}": "tls_client_auth: needs <cert_file> <key_file>",
		"sangho_dedup {\nsecret s\nstore nosuch\n}":                        "store: not one of ",
		"sangho_dedup {\nsecret s\nmax_body_size huge\n}":                  `max_body_size: invalid size "huge"`,
		"sangho_dedup {\nsecret s\nrequire_body_id yes\n}":                 `require_body_id: must be on or off, not "yes"`,
		"sangho_dedup {\nsecret s\nmax_body_size 65MiB\n}":                 "max_body_size: 65MiB is over the maximum of 64MiB",
		"sangho_dedup {\nsecret s\nmax_body_size 1.5\n}":                   "max_body_size: 1.5 is not a whole number of bytes (with a unit? e.g. 1.5MiB)",
		"sangho_dedup {\nsecret s\nmax_body_size 1.5B\n}":                  "max_body_size: 1.5B is not a whole number of bytes",
		"sangho_dedup {\nsecret s\nmax_body_size 2.5b\n}":                  "max_body_size: 2.5b is not a whole number of bytes",
		// bounds where the value is written, quoted as written
		"sangho_dedup {\nsecret s\ntolerance 8d\n}":                                 `tolerance: "8d" is over the maximum of 7d, at Testfile:3`,
		"sangho_dedup {\nsecret s\nretention 3651d\n}":                              `retention: "3651d" is over the maximum of 3650d`,
		"sangho_dedup {\nsecret s\nlock_ttl 10ms\n}":                                `lock_ttl: "10ms" is under the minimum of 30ms`,
		"sangho_dedup {\nsecret s\nretry_after 2d\n}":                               `retry_after: "2d" is over the maximum of 24h`,
		"sangho_dedup {\nsecret s\nstore redis {\nwrite_timeout 1d\n}\n}":           `write_timeout: "1d" is over the maximum of 1h`,
		"sangho_dedup {\nsecret s\nstore postgres {\nstatement_timeout 500us\n}\n}": `statement_timeout: "500us" is under the minimum of 1ms`,
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
}

// TestCaddyfileDurationErrorNotRewritten: a bad duration's error never
// quotes Caddy's parser's rewrite of it (days as hours: "3days" read as
// "72hays", `unknown unit "hays" in duration "72hays"`): a value with a
// d gets the form and range accepted, any other Go's error, which quotes
// it as written and names a bad unit.
func TestCaddyfileDurationErrorNotRewritten(t *testing.T) {
	for in, want := range map[string]string{
		"3days":    `retention: invalid duration "3days": write a number and a unit per part (ns, us, µs, ms, s, m, h, d), as 90s, 72h, 3d or 1d12h, under 106752d`,
		"1dd":      `retention: invalid duration "1dd": write a number and a unit per part`,
		"2d4x":     `retention: invalid duration "2d4x": write a number and a unit per part`,
		"110000d":  `retention: invalid duration "110000d": write a number and a unit per part (ns, us, µs, ms, s, m, h, d), as 90s, 72h, 3d or 1d12h, under 106752d`,
		"3000000d": `retention: invalid duration "3000000d": write a number`,
		"1h30min":  `retention: invalid duration "1h30min": time: unknown unit "min" in duration "1h30min"`,
		"3D":       `retention: invalid duration "3D": time: unknown unit "D" in duration "3D"`,
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\nretention " + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("retention %s: error %v, want it to contain %q", in, err, want)
		}
	}
}

// TestCaddyfileAdapt compares Caddyfile→JSON with the golden files in
// testdata/caddyfile_adapt, as Caddy core does. Each file is a Caddyfile,
// a line of dashes, and the expected JSON.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.SplitN(string(data), "----------", 2)
		if len(parts) != 2 {
			t.Fatalf("%s: no ---------- separator", f)
		}
		if !caddytest.CompareAdapt(t, f, parts[0], "caddyfile", strings.TrimSpace(parts[1])) {
			t.Errorf("%s: adapted JSON differs from the golden file", f)
		}
	}
}

// TestExampleCaddyfileAdapts keeps example.Caddyfile valid.
func TestExampleCaddyfileAdapts(t *testing.T) {
	data, err := os.ReadFile("example.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	cfg, warnings := adaptCaddyfile(t, string(data))
	if len(warnings) > 0 {
		t.Errorf("warnings: %v", warnings)
	}
	if !strings.Contains(cfg, `"handler":"sangho_dedup"`) || !strings.Contains(cfg, `{env.SANGHO_WEBHOOK_SECRET}`) {
		t.Fatalf("example does not put sangho_dedup in front with the env secret: %s", cfg)
	}
	if strings.Index(cfg, `"handler":"sangho_dedup"`) > strings.Index(cfg, `"handler":"reverse_proxy"`) {
		t.Fatal("sangho_dedup does not run before reverse_proxy")
	}
}

// TestCaddyfileUnsetEnvSecret: Caddy replaces {$VAR} in the whole
// Caddyfile before the directive sees a token, so an unset or empty
// variable leaves `secret` with no value (it said "wrong argument
// count") or, quoted, an empty one (refused only at start, as "secret
// #1 is empty"). The error names the variable when the Caddyfile came
// from a file (read back to find it), points to {env.VAR} either way,
// and never shows a value.
func TestCaddyfileUnsetEnvSecret(t *testing.T) {
	const unset, empty, set = "SANGHO_DEDUP_TEST_UNSET_SECRET", "SANGHO_DEDUP_TEST_EMPTY_SECRET", "SANGHO_DEDUP_TEST_SET_SECRET"
	os.Unsetenv(unset)
	t.Setenv(empty, "")
	t.Setenv(set, "whsec_from_the_environment")
	adapt := func(src string, fromFile bool) error {
		t.Helper()
		var opts map[string]any
		if fromFile {
			path := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
				t.Fatal(err)
			}
			opts = map[string]any{"filename": path}
		}
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), opts)
		return err
	}
	site := func(secretLine string) string {
		return ":8080 {\n\tsangho_dedup {\n\t\tprovider stripe\n\t\t" + secretLine + "\n\t}\n\trespond 200\n}\n"
	}
	for _, c := range []struct {
		line string
		name string
	}{
		{"secret {$" + unset + "}", unset},
		{`secret "{$` + empty + `}"`, empty},
		{"secret {$" + unset + ":}", unset},
		// One of a rotation's secrets dropped without a word: refused, as
		// it is on a line of its own (found by review: it adapted with
		// the other secret only).
		{"secret {$" + set + "} {$" + unset + "}", unset},
	} {
		err := adapt(site(c.line), true)
		if c.name == "" {
			if err != nil {
				t.Errorf("%s: %v", c.line, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s adapted", c.line)
			continue
		}
		for _, want := range []string{"secret", "{$" + c.name + "}", "unset or empty", "{env." + c.name + "}"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error lacks %q: %v", c.line, want, err)
			}
		}
		if strings.Contains(err.Error(), "wrong argument count") {
			t.Errorf("%s: still the generic error: %v", c.line, err)
		}
	}

	// A {$VAR} inside a secret, unset or empty, would leave the text
	// around it: whsec_, a secret anyone can sign with. Refused, the
	// variable named. (Found by review: it adapted, and Caddy ran with
	// the secret "whsec_".) Set, it is part of the secret as written.
	for _, line := range []string{"secret whsec_{$" + unset + "}", `secret "whsec_{$` + empty + `}"`, "secret {$" + set + "} whsec_{$" + unset + ":}",
		// quoted with a space, and two variables in one token (found by review)
		`secret "whsec {$` + unset + `}"`, "secret {$" + set + "}{$" + unset + "}",
		// continued onto the next line, and after an escaped quote (found by review)
		"secret \\\n\t\twhsec_{$" + unset + "}", `secret "ab\"cd {$` + unset + `}"`} {
		err := adapt(site(line), true)
		if err == nil {
			t.Errorf("%s adapted", line)
			continue
		}
		name := unset
		if strings.Contains(line, empty) {
			name = empty
		}
		for _, want := range []string{"secret", "{$" + name + "}", "unset or empty", "{env." + name + "}"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error lacks %q: %v", line, want, err)
			}
		}
	}
	if err := adapt(site("secret whsec_{$"+set+"}"), true); err != nil {
		t.Errorf("secret whsec_{$VAR} with VAR set: %v", err)
	}

	// Adapted from memory (the admin API's /load, a test): no file to read
	// the name from; the error still says what to look for.
	err := adapt(site("secret {$"+unset+"}"), false)
	if err == nil || !strings.Contains(err.Error(), "secret has no value") || !strings.Contains(err.Error(), "{$VAR}") || !strings.Contains(err.Error(), "{env.VAR}") {
		t.Errorf("from memory: %v", err)
	}
	// A literal secret line with no value is not blamed on a variable.
	err = adapt(site("secret"), true)
	if err == nil || !strings.Contains(err.Error(), "secret has no value") || strings.Contains(err.Error(), "{$"+unset) {
		t.Errorf("secret with no value: %v", err)
	}
	// Set, {$VAR} works, and the secret is in the adapted JSON: why the
	// docs prefer {env.VAR}.
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site("secret {$"+set+"}")), nil)
	if err != nil || !strings.Contains(string(out), "whsec_from_the_environment") {
		t.Errorf("{$VAR} set: %v\n%s", err, out)
	}
	// A {$VAR} that is the whole of an optional argument or of one value
	// of a list, unset: Caddy drops the token, and the line means
	// something else without a word. store file {$DB} became the default
	// store, another database, so every event was processed again (found
	// by review); a Redis address dropped from a list is another server
	// set. Refused, the variable named.
	for _, c := range []struct{ option, store string }{
		{"store file", "store file {$" + unset + "}"},
		{"store file", "store file \"{$" + empty + "}\""},
		{"address", "store redis {\n\t\t\taddress 127.0.0.1:6379 {$" + unset + "}\n\t\t}"},
	} {
		err := adapt(site("secret s\n\t\t"+c.store), true)
		if err == nil {
			t.Errorf("%s: adapted", c.store)
			continue
		}
		name := unset
		if strings.Contains(c.store, empty) {
			name = empty
		}
		for _, want := range []string{c.option, "{$" + name + "}", "unset or empty"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error lacks %q: %v", c.store, want, err)
			}
		}
		if strings.Contains(err.Error(), "store file: store file:") {
			t.Errorf("%s: the store's prefix is doubled: %v", c.store, err)
		}
	}
	// A variable set to white space only is dropped by Caddy's lexer as an
	// unset one is; one unset inside the store's path leaves the text
	// around it: /dedup.db, another database. (Both found by review.)
	t.Setenv("SANGHO_DEDUP_TEST_SPACE", " \t")
	for _, c := range []struct{ option, line, name string }{
		{"secret", "secret {$" + set + "} {$SANGHO_DEDUP_TEST_SPACE}", "SANGHO_DEDUP_TEST_SPACE"},
		{"store file", "secret s\n\t\tstore file {$" + unset + "}/dedup.db", unset},
		{"path", "secret s\n\t\tstore file {\n\t\t\tpath {$" + unset + "}/dedup.db\n\t\t}", unset},
		// Inside a Redis address or url, or a PostgreSQL DSN: the text
		// around it is another server, another dedup state (found by
		// review: redis://:6379/0, the local Redis).
		{"address", "secret s\n\t\tstore redis {\n\t\t\taddress {$" + unset + "}:6379\n\t\t}", unset},
		{"url", "secret s\n\t\tstore redis {\n\t\t\turl redis://{$" + unset + "}:6379/0\n\t\t}", unset},
		{"dsn", "secret s\n\t\tstore postgres {\n\t\t\tdsn postgres://u:p@{$" + unset + "}/db\n\t\t}", unset},
	} {
		err := adapt(site(c.line), true)
		if err == nil || !strings.Contains(err.Error(), c.option) || !strings.Contains(err.Error(), "{$"+c.name+"}") {
			t.Errorf("%s: %v, want an error naming %s and {$%s}", c.line, err, c.option, c.name)
		}
		if err != nil && strings.Contains(err.Error(), "store file: store file:") {
			t.Errorf("%s: the store's prefix is doubled: %v", c.line, err)
		}
	}
	// Set, or with a default, they are the values written.
	for _, store := range []string{"store file {$" + unset + ":/tmp/x.db}", "store file"} {
		if err := adapt(site("secret s\n\t\t"+store), true); err != nil {
			t.Errorf("%s: %v", store, err)
		}
	}

	// A store's secret-bearing option (a Redis password or URL, a
	// PostgreSQL DSN) left empty by {$VAR}: named the same way.
	for _, c := range []struct{ option, store string }{
		{"password", "store redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\tpassword {$" + unset + "}\n\t\t}"},
		{"url", "store redis {\n\t\t\turl \"{$" + empty + "}\"\n\t\t}"},
		{"dsn", "store postgres {\n\t\t\tdsn {$" + unset + "}\n\t\t}"},
	} {
		name := unset
		if c.option == "url" {
			name = empty
		}
		err := adapt(site("secret s\n\t\t"+c.store), true)
		if err == nil {
			t.Errorf("%s: adapted", c.store)
			continue
		}
		for _, want := range []string{c.option + " has no value", "{$" + name + "}", "unset or empty", "{env." + name + "}"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error lacks %q: %v", c.option, want, err)
			}
		}
	}
	// and the docs say both, where secrets are explained
	for _, doc := range []string{"README.md", "docs/configuration.md", "docs/security.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		if text := strings.Join(strings.Fields(string(b)), " "); !strings.Contains(text, "`{$X}`") || !strings.Contains(text, "adapted JSON") || !strings.Contains(text, "`{env.X}`") {
			t.Errorf("%s does not say what {$X} does beside {env.X}", doc)
		}
	}
}

// TestCaddyfileMultiLineEnvValueNotQuoted: Caddy replaces {$VAR} in the
// text before it splits it into lines, so a value with a line break (a
// secret, a key=value DSN pasted from a file) puts its second line where
// an option's name goes. The unknown-option error must not quote it.
func TestCaddyfileMultiLineEnvValueNotQuoted(t *testing.T) {
	const tail = "TOPSECRETTAIL"
	t.Setenv("SANGHO_DEDUP_TEST_ML", "hunter2\n"+tail+" more")
	for _, c := range []struct{ where, block string }{
		{"sangho_dedup", "secret {$SANGHO_DEDUP_TEST_ML}"},
		{"redis store", "secret s\n\t\tstore redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\tpassword {$SANGHO_DEDUP_TEST_ML}\n\t\t}"},
		{"postgres store", "secret s\n\t\tstore postgres {\n\t\t\tdsn {$SANGHO_DEDUP_TEST_ML}\n\t\t}"},
		{"file store", "secret s\n\t\tstore file {\n\t\t\tpath /tmp/x{$SANGHO_DEDUP_TEST_ML}\n\t\t}"},
		{"hmac provider", "secret s\n\t\tprovider hmac {\n\t\t\theader {$SANGHO_DEDUP_TEST_ML}\n\t\t\tid_header X-Id\n\t\t}"},
	} {
		src := ":8080 {\n\tsangho_dedup {\n\t\t" + c.block + "\n\t}\n\trespond 200\n}\n"
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err == nil {
			t.Errorf("%s: adapted", c.where)
			continue
		}
		if strings.Contains(err.Error(), tail) || !strings.Contains(err.Error(), "unrecognized") {
			t.Errorf("%s: %v, want the unknown option refused without quoting it", c.where, err)
		}
	}
	// Secrets in lower case look like option names (letters, digits and
	// _): a Standard Webhooks or Stripe secret with a lower-case key, a
	// hex GitHub secret, a passphrase. None is quoted, as a line of its
	// own where an option goes nor in a block that takes none (found by
	// review: each was printed).
	for _, lower := range []string{"whsec_9a8b7c6d5e4f3a2b", "3f9c2e7a1b0d4c6e8f2a9b7c5d3e1f0a2b4c6d8e", "correcthorsebatterystaple", "hunter"} {
		t.Setenv("SANGHO_DEDUP_TEST_ML", "whsec_first\n"+lower)
		for _, block := range []string{
			"secret {$SANGHO_DEDUP_TEST_ML}",
			"secret s\n\t\tstore redis {\n\t\t\taddress 127.0.0.1:6379\n\t\t\tpassword {$SANGHO_DEDUP_TEST_ML}\n\t\t}",
			"secret s\n\t\tprovider hmac {\n\t\t\theader {$SANGHO_DEDUP_TEST_ML}\n\t\t\tid_header X-Id\n\t\t}",
			"secret s\n\t\tprovider stripe {\n\t\t\t" + lower + "\n\t\t}",
			"secret s\n\t\tstore memory {\n\t\t\t" + lower + "\n\t\t}",
		} {
			src := ":8080 {\n\tsangho_dedup {\n\t\t" + block + "\n\t}\n\trespond 200\n}\n"
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
			if err == nil || strings.Contains(err.Error(), lower) {
				t.Errorf("%s: %v, want it refused without quoting %s", block, err, lower)
			}
		}
	}
}

// TestCaddyfileExtraValueNotQuoted: a value on a line that takes none
// (the directive's, a store's, a provider's) is refused without quoting
// it: what a user puts there by mistake is often the secret, a DSN or a
// URL with its password, and Caddy's ArgErr would print it.
func TestCaddyfileExtraValueNotQuoted(t *testing.T) {
	const secret = "hunter2TOPSECRET"
	for _, c := range []struct{ line, want string }{
		{"sangho_dedup whsec_" + secret + " {\n\t\tsecret s\n\t}", "sangho_dedup: takes no value on its line"},
		{"sangho_dedup /hook whsec_" + secret + " {\n\t\tsecret s\n\t}", "sangho_dedup: takes no value on its line"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore memory whsec_" + secret + "\n\t}", "store memory: takes no value on its line"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore redis redis://:" + secret + "@127.0.0.1:1\n\t}", "store redis: takes no value on its line (write url <url> or address <host:port> in its block)"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore redis redis://:" + secret + "@127.0.0.1:1 {\n\t\t\tdb 1\n\t\t}\n\t}", "store redis: takes no value on its line"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore postgres postgres://u:" + secret + "@127.0.0.1:1/db\n\t}", "store postgres: takes no value on its line (write dsn <dsn> in its block)"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore file /var/lib/x.db " + secret + "\n\t}", "store file: takes at most its path on its line"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tprovider hmac whsec_" + secret + " {\n\t\t\theader X-Sig\n\t\t}\n\t}", "provider hmac: takes no value on its line"},
		// a value in a module's name or a flag's place
		{"sangho_dedup {\n\t\tsecret s\n\t\tprovider whsec_" + secret + "\n\t}", "provider: not one of github, hmac, sangho, shopify, standard_webhooks, stripe; the value is not repeated here"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore redis://:" + secret + "@127.0.0.1:1\n\t}", "store: not one of file, memory, postgres, redis; the value is not repeated here"},
		{"sangho_dedup {\n\t\tsecret s\n\t\tstore redis {\n\t\t\ttls " + secret + "\n\t\t}\n\t}", "tls: takes no argument; the value is not repeated here"},
	} {
		src := ":8080 {\n\t" + c.line + "\n\trespond 200\n}\n"
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), secret) {
			t.Errorf("%s\nerror: %v\nwant it to contain %q and not the value given", c.line, err, c.want)
		}
	}
}

// TestJSONDurationErrorNamesTheKey: a bad duration in JSON is answered
// with its key and the value as written, as in a Caddyfile: Caddy's own
// error named neither ("time: unknown unit \"hays\" in duration
// \"72hays\"" for "tolerance": "3days"). Through Caddy's own loading.
func TestJSONDurationErrorNamesTheKey(t *testing.T) {
	for _, c := range []struct{ handler, want string }{
		{`"tolerance":"3days"`, `tolerance: invalid duration "3days": write a number and a unit per part`},
		{`"retention":"1x"`, `retention: invalid duration "1x": time: unknown unit "x" in duration "1x"`},
		{`"lock_ttl":true`, `lock_ttl: invalid duration true`},
		// other type errors name the key too, not the decoder's type
		{`"max_body_size":"big"`, `max_body_size: a JSON string, not the int64 it takes`},
		{`"store":{"type":"redis","db":"one"}`, `db: a JSON string, not the int it takes`},
		{`"store":{"type":"redis","address":["127.0.0.1:1"],"dial_timeout":"2dd"}`, `dial_timeout: invalid duration "2dd": write a number`},
		{`"store":{"type":"postgres","dsn":"postgres://u@127.0.0.1:1/db","statement_timeout":"5sec"}`, `statement_timeout: invalid duration "5sec": time: unknown unit "sec"`},
	} {
		cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[{"handler":"sangho_dedup","secret":["k"],` +
			c.handler + `},{"handler":"static_response"}]}]}}}}}`
		err := caddy.Validate(mustConfig(t, cfg))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v\nwant %q", c.handler, err, c.want)
		}
	}
	// Unknown keys are still refused, as Caddy refuses them.
	if err := caddy.Validate(mustConfig(t, `{"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[{"handler":"sangho_dedup","secret":["k"],"retenton":"3d"}]}]}}}}}`)); err == nil || !strings.Contains(err.Error(), `unknown field "retenton"`) {
		t.Errorf("an unknown key: %v", err)
	}
}

func mustConfig(t *testing.T, s string) *caddy.Config {
	t.Helper()
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(s), &cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

// TestCaddyfileUnsetVarInKeyPrefix: key_prefix {$TENANT}: with TENANT
// unset or empty would be ":", another namespace of event IDs (shared by
// every tenant whose variable is missing: each would answer the others'
// events as duplicates), without a word. Refused, the variable named;
// set, or with a default ({$TENANT:acme}), it is the prefix as written.
// (Found by the configuration review: the secret, the store's path, the
// DSN and the Redis url refuse it; key_prefix did not.)
func TestCaddyfileUnsetVarInKeyPrefix(t *testing.T) {
	const unset, empty, set = "SANGHO_DEDUP_TEST_UNSET_TENANT", "SANGHO_DEDUP_TEST_EMPTY_TENANT", "SANGHO_DEDUP_TEST_SET_TENANT"
	os.Unsetenv(unset)
	t.Setenv(empty, "")
	t.Setenv(set, "acme")
	for line, want := range map[string]string{
		"key_prefix {$" + unset + "}:":       "{$" + unset + "}",
		"key_prefix tenant_{$" + empty + "}": "{$" + empty + "}",
		"key_prefix {$" + set + "}:":         "",
		"key_prefix {$" + unset + ":acme}:":  "",
	} {
		src := ":8080 {\n\tsangho_dedup {\n\t\tsecret s\n\t\t" + line + "\n\t}\n\trespond 200\n}\n"
		path := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), map[string]any{"filename": path})
		if want == "" {
			if err != nil || !strings.Contains(string(cfg), `"key_prefix":"acme:"`) {
				t.Errorf("%s: %v, want key_prefix acme:", line, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "key_prefix") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming key_prefix and %s", line, err, want)
		}
	}
}

// TestMaxBodySizeDecimalCommaRefused: humanize reads ',' as a thousands
// separator, so "1,5MiB" (a decimal comma) was 15 MiB, over what the
// user meant by ten, and "1,5" 15 bytes, every delivery 413 (found by
// the body mutation pass). Refused, as "1.5" is, naming the option.
func TestMaxBodySizeDecimalCommaRefused(t *testing.T) {
	for _, s := range []string{"1,5MiB", "0,5MiB", "1,5", "1,048,576"} {
		h := new(Handler)
		d := caddyfile.NewTestDispenser("sangho_dedup {\n\tsecret x\n\tmax_body_size " + s + "\n}")
		if err := h.UnmarshalCaddyfile(d); err == nil || !strings.Contains(err.Error(), "max_body_size") {
			t.Errorf("max_body_size %s: %v, accepted as %d bytes", s, err, h.MaxBodySize)
		}
	}
}
