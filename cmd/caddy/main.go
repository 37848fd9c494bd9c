// Command caddy is Caddy with its standard modules and sangho_dedup,
// built from this checkout: `go build ./cmd/caddy`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/sangho/caddy-sangho-dedup"
)

func main() {
	caddycmd.Main()
}
