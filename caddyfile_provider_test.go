package sanghodedup

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfileProvider(t *testing.T) {
	for in, want := range map[string]string{
		"":                           "",
		"provider sangho":            `{"name":"sangho"}`,
		"provider stripe":            `{"name":"stripe"}`,
		"provider standard_webhooks": `{"name":"standard_webhooks"}`,
		"provider github":            `{"name":"github"}`,
		"provider shopify":           `{"name":"shopify"}`,
		"provider github {\n}":       `{"name":"github"}`,
		"provider hmac {\nheader X-Sig\nalgorithm sha512\nencoding base64\nprefix sha512=\ntimestamp_header X-Ts\nsigned_content \"{timestamp}:{body}\"\nid_header X-Id\nid_field event_id\n}": `{"name":"hmac","header":"X-Sig","algorithm":"sha512","encoding":"base64","prefix":"sha512=","timestamp_header":"X-Ts","signed_content":"{timestamp}:{body}","id_header":"X-Id","id_field":"event_id"}`,
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}")); err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if want == "" {
			if h.ProviderRaw != nil {
				t.Errorf("no provider line: verifier %s, want none (sangho by default)", h.ProviderRaw)
			}
			continue
		}
		var got, exp any
		if err := json.Unmarshal(h.ProviderRaw, &got); err != nil {
			t.Fatal(err)
		}
		_ = json.Unmarshal([]byte(want), &exp)
		if !reflect.DeepEqual(got, exp) {
			t.Errorf("%q: verifier %s, want %s", in, h.ProviderRaw, want)
		}
	}
}

// TestCaddyfileProviderErrors: each bad provider line is a Caddyfile
// error that names the problem.
func TestCaddyfileProviderErrors(t *testing.T) {
	hmacBlock := func(lines string) string {
		return "provider hmac {\nheader X-Sig\nid_field id\n" + lines + "\n}"
	}
	for in, want := range map[string]string{
		"provider":                                                "wrong argument count",
		"provider nosuch":                                         "provider: not one of github, hmac, sangho, shopify, standard_webhooks, stripe",
		"provider github\nprovider shopify":                       "provider given more than once",
		"provider github extra":                                   `provider github: takes no arguments (a secret goes in secret)`,
		"provider stripe {\ntolerance 1m\n}":                      `provider stripe: takes no options, found "tolerance"`,
		"provider standard_webhooks {\nsvix on\n}":                `provider standard_webhooks: takes no options (found a token not shown`,
		"provider hmac extra {\n}":                                "provider hmac: takes no value on its line",
		hmacBlock("frobnicate 1"):                                 `provider hmac: unrecognized option (not shown`,
		hmacBlock("algoritm sha1"):                                `provider hmac: unrecognized option (not shown, as it may be a secret; did you mean algorithm?)`,
		hmacBlock("algorithm md5"):                                `algorithm must be sha256, sha512 or sha1, not "md5"`,
		hmacBlock("encoding base32"):                              `encoding must be hex or base64, not "base32"`,
		hmacBlock("algorithm sha1\nalgorithm sha256"):             "algorithm given more than once",
		hmacBlock("prefix"):                                       "prefix: needs a value",
		hmacBlock(`prefix ""`):                                    `prefix: needs a value, not ""`,
		hmacBlock("prefix a b"):                                   "prefix: takes one value, got more",
		hmacBlock("signed_content {timestamp}"):                   "must hold {body} exactly once",
		hmacBlock("timestamp_header X-Ts\nsigned_content {body}"): "timestamp_header is set but signed_content has no {timestamp}",
		hmacBlock(`timestamp_header "X Ts"`):                      `timestamp_header "X Ts" is not a valid header name`,
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want it to contain %q", in, err, want)
		}
	}
}

// TestCaddyfileProviderErrorsExact: a provider's Caddyfile error is
// prefixed once with the provider's name (it read "provider hmac:
// provider hmac: ..." when both the scheme and the handler's parser
// added it).
func TestCaddyfileProviderErrorsExact(t *testing.T) {
	for in, want := range map[string]string{
		"provider hmac {\nheader X-Sig\nid_field id\nalgorithm md5\n}": `provider hmac: algorithm must be sha256, sha512 or sha1, not "md5", at Testfile:7`,
		"provider hmac {\nheader X-Sig\nheader X-Other\n}":             `provider hmac: header given more than once, at Testfile:5`,
		"provider hmac {\nfrobnicate 1\n}":                             `provider hmac: unrecognized option (not shown: it is no option's name, and may be a secret, e.g. the next line of a {$VAR}'s value), at Testfile:4`,
		"provider hmac {\nid_feild id\n}":                              `provider hmac: unrecognized option (not shown, as it may be a secret; did you mean id_field?), at Testfile:4`,
		"provider github extra":                                        `provider github: takes no arguments (a secret goes in secret), at Testfile:3`,
		"provider stripe whsec_on_the_wrong_line":                      `provider stripe: takes no arguments (a secret goes in secret), at Testfile:3`,
		"store memory {\nx\n}":                                         `store memory: takes no options (found a token not shown: it is no option's name, and may be a secret), at Testfile:4`,
		"store memory {\nretention 1h\n}":                              `store memory: takes no options, found "retention", at Testfile:4`,
		"provider stripe {\ntolerance 1m\n}":                           `provider stripe: takes no options, found "tolerance", at Testfile:4`,
		// A token that is no option's name, nor a typo of one, is not
		// quoted: it is often a secret put in the wrong block (found by
		// review: it was). An option of another block is.
		"provider stripe {\nwhsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n}": `provider stripe: takes no options (found a token not shown: it is no option's name, and may be a secret), at Testfile:4`,
		"store memory {\nwhsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n}":    `store memory: takes no options (found a token not shown: it is no option's name, and may be a secret), at Testfile:4`,
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("sangho_dedup {\nsecret s\n" + in + "\n}"))
		if err == nil || err.Error() != want {
			t.Errorf("%q: error %v, want %s", in, err, want)
		}
	}
}
