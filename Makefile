# Targets for people; CI runs .ci/run.
.PHONY: test bench fuzz reliability build

build:
	go build -o caddy ./cmd/caddy

# The README's test command.
test:
	go test -race -count=1 ./...

# Side-by-side benchmark: backend alone, plain reverse_proxy, sangho_dedup
# on memory and on Redis. Writes bench/RESULTS.md.
bench:
	mkdir -p bench/out
	go build -o bench/out/caddy ./cmd/caddy
	go build -o bench/out/sangho-bench ./cmd/sangho-bench
	./bench/out/sangho-bench --caddy bench/out/caddy --out bench/RESULTS.md
	go test -run '^$$' -bench . -benchmem -count 3 . | tee bench/out/go-bench.txt
