package sangho

import (
	"testing"
	"time"
)

// The known-answer vectors of ../shared/sangho-webhooks.md.
func TestSignKnownAnswers(t *testing.T) {
	bodyA := `{"id":"evt_1QZtest000000000001","object":"event","type":"payment_intent.succeeded","created":1733140795,"data":{"object":{"id":"pi_1","amount":2000,"currency":"eur"}}}`
	cases := []struct{ secret, body, want string }{
		{"whsec_test_secret_1", bodyA, "t=1733140800,v1=d4947c4378dcdca15634cb0ccec34c3024dbfdba1e13d930701c200062d02c6a"},
		{"whsec_rotated_secret_2", bodyA, "t=1733140800,v1=be431af600a03ff202556f2580ea26e486bc936f384f0067abff766c64e2e3ac"},
		{"whsec_test_secret_1", "", "t=1733140800,v1=8715d84e13e6f9fbb72187708a156749484e3bde9c7fd1e454a3719bbacbd648"},
	}
	for _, c := range cases {
		if got := Sign(time.Unix(1733140800, 0), []byte(c.body), c.secret); got != c.want {
			t.Errorf("Sign = %q, want %q", got, c.want)
		}
	}
	both := Sign(time.Unix(1733140800, 0), []byte(bodyA), "whsec_test_secret_1", "whsec_rotated_secret_2")
	if both != cases[0].want+",v1=be431af600a03ff202556f2580ea26e486bc936f384f0067abff766c64e2e3ac" {
		t.Errorf("rotation header = %q", both)
	}
}
