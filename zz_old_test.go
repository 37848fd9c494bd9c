package sanghodedup

import (
	"testing"
)

func TestZZAdapt(t *testing.T) {
	for _, src := range []string{`webhooks.example.com {
	sangho_dedup /stripe {
		secret s
	}
	reverse_proxy 127.0.0.1:3000
}`, `:8080 {
	sangho_dedup /stripe {
		secret s
	}
	reverse_proxy 127.0.0.1:3000
}`, `:8080 {
	route {
		sangho_dedup /stripe {
			secret s
		}
		reverse_proxy 127.0.0.1:3000
	}
}`} {
		j, _ := adaptCaddyfile(t, src)
		t.Log(j)
	}
}
