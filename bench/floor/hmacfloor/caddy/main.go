// Command caddy is the benchmark's Caddy with the floor: Caddy's
// standard modules, sangho_dedup and the bench-only sangho_hmac_floor
// (package hmacfloor). For sangho-bench --floor-caddy only:
//
//	go build -o bench/out/caddy-floor ./bench/floor/hmacfloor/caddy
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/sangho/caddy-sangho-dedup"
	_ "github.com/sangho/caddy-sangho-dedup/bench/floor/hmacfloor"
)

func main() {
	caddycmd.Main()
}
