package providers

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sangho/caddy-sangho-dedup/dedup"
)

// reasonError is an error with its own message that counts as one of
// dedup's ErrSignature* reasons (errors.Is).
type reasonError struct {
	msg    string
	reason error
}

func (e *reasonError) Error() string { return e.msg }
func (e *reasonError) Unwrap() error { return e.reason }

// Errors shared by the providers. None carries a secret or a signature.
var (
	errSigMissing   = dedup.ErrSignatureMissing
	errSigMalformed = dedup.ErrSignatureMalformed
	errSigTimestamp = dedup.ErrSignatureTimestamp
	errSigMismatch  = dedup.ErrSignatureMismatch
	// ErrSignaturePrefix: the signature lacks the provider's prefix
	// (sha256=, v1,).
	ErrSignaturePrefix = &reasonError{"signature does not start with the expected prefix", dedup.ErrSignatureMalformed}
	// ErrSignatureEncoding: not a MAC of the expected encoding and length.
	ErrSignatureEncoding = &reasonError{"signature is not valid for the expected encoding and hash length", dedup.ErrSignatureMalformed}
	// ErrSignatureCount: a signature header sent more than once (which
	// one would a backend read?).
	ErrSignatureCount = &reasonError{"more than one signature header", dedup.ErrSignatureMalformed}
)

// headerValue returns the one value of header name: "" and no error
// when it is absent, ErrSignatureCount when it is sent more than once.
func headerValue(h http.Header, name string) (string, error) {
	vs := h[name]
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("%w: %s", ErrSignatureCount, name)
}

// requireHeader is headerValue for a header that must be present and
// not empty.
func requireHeader(h http.Header, name string) (string, error) {
	v, err := headerValue(h, name)
	if err == nil && v == "" {
		err = fmt.Errorf("%w: %s", errSigMissing, name)
	}
	return v, err
}

// Defaults shared by the providers that sign a timestamp, and Sangho's
// own headers.
const (
	DefaultTolerance      = 5 * time.Minute
	SanghoSignatureHeader = "Sangho-Signature"
	SanghoEventIDHeader   = "Sangho-Event-ID"
)
