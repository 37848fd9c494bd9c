package sanghodedup

import "github.com/sangho/caddy-sangho-dedup/internal/testkit/sangho"

// The known-answer vectors of ../shared/sangho-webhooks.md.
const (
	bodyA   = sangho.BodyA
	bodyB   = sangho.BodyB
	secret1 = sangho.Secret1
	secret2 = sangho.Secret2
)

var vectors = sangho.Vectors
