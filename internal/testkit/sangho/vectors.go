package sangho

// The known-answer vectors of ../shared/sangho-webhooks.md, computed
// outside this project: the tests of every package sign and check with
// them.
const (
	BodyA = `{"id":"evt_1QZtest000000000001","object":"event","type":"payment_intent.succeeded","created":1733140795,"data":{"object":{"id":"pi_1","amount":2000,"currency":"eur"}}}`
	BodyB = `{"id":"evt_unicode_body","type":"customer.updated","data":{"object":{"name":"Zoë ✓"}}}`

	Secret1 = "whsec_test_secret_1"
	Secret2 = "whsec_rotated_secret_2"
)

// Vector is one signature of the contract: v1 is the hex HMAC-SHA256 of
// "<T>.<Body>" keyed with Secret.
type Vector struct {
	Secret string
	T      int64
	Body   string
	V1     string
}

// Vectors are the contract's known answers.
var Vectors = []Vector{
	{Secret1, 1733140800, BodyA, "d4947c4378dcdca15634cb0ccec34c3024dbfdba1e13d930701c200062d02c6a"},
	{Secret2, 1733140800, BodyA, "be431af600a03ff202556f2580ea26e486bc936f384f0067abff766c64e2e3ac"},
	{Secret1, 1733140800, "", "8715d84e13e6f9fbb72187708a156749484e3bde9c7fd1e454a3719bbacbd648"},
	{Secret1, 1733141000, BodyB, "b9cd857ee195a55b186d871412f3355763f83a05498a41fc70091b587635ae8e"},
}
