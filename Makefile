# Targets for people; CI runs .ci/run.
.PHONY: test test-short lint bench fuzz reliability distributions soak build panels

build:
	go build -o caddy ./cmd/caddy

# The README's test command.
test:
	go test -race -count=1 -timeout 30m ./...

# The quick tier: no server and no tool but Go (memory and file stores,
# providers, Caddyfile, handler); under a minute.
test-short:
	go test -short -count=1 ./...

# gofmt, go vet and staticcheck (fetched through the module proxy at a
# pinned version; not a dependency of the module).
STATICCHECK = honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
	go vet -tags soak ./reliability
	go run $(STATICCHECK) ./...
	go run $(STATICCHECK) -tags soak ./reliability

# The reliability suite at 5x the CI size, with its figures.
reliability:
	mkdir -p bench/out
	RELIABILITY_SCALE=5 go test -count=1 -v -timeout 20m ./reliability > bench/out/reliability.log 2>&1; \
	status=$$?; grep -E '^(FIGURES|--- |ok|FAIL)' bench/out/reliability.log; exit $$status

# The faults whose doubles are by nature, 10 runs each at the CI size,
# as distributions (bench/DISTRIBUTIONS.md); about 15 minutes here.
distributions:
	mkdir -p bench/out
	go test -count=10 -v -timeout 60m -run 'TestCaddyKilledWithEventsInFlight|TestDefaultStoreKilledAndRestarted|TestSentinelFailover|TestRedisCluster$$' ./reliability > bench/out/distributions.log 2>&1; \
	status=$$?; { echo "# Distributions of the by-nature doubles"; echo; \
	  echo "- date: $$(date -u '+%Y-%m-%d %H:%M UTC'); commit $$(git rev-parse --short HEAD); 10 runs of each test at the CI size (make distributions)"; echo; \
	  go run ./cmd/sangho-figures < bench/out/distributions.log; } | tee bench/DISTRIBUTIONS.md; exit $$status

# An hour at a moderate rate with redeliveries and faults, on Redis and on
# the default file store; fails if memory, goroutines, FDs or the store
# grow once the retention window is full. .ci/run runs 2 minutes of it.
soak:
	mkdir -p bench/out
	SOAK_DURATION=60m go test -tags soak -count=1 -v -timeout 90m -run TestSoak ./reliability > bench/out/soak.log 2>&1; \
	status=$$?; grep -E '^(\||soak|FIGURES|--- |ok|FAIL)' bench/out/soak.log; exit $$status

fuzz:
	for target in ./providers:FuzzSignatureHeader .:FuzzExtractEvent .:FuzzHandler .:FuzzScanMatchesReference ./providers:FuzzProviderSignatures ./dedup:FuzzDoneRecordEncodings ./stores/file:FuzzDecodeRecord; do \
		go test -run '^$$' -fuzz "^$${target#*:}\$$" -fuzztime 60s "$${target%%:*}" || exit 1; \
	done

# Side-by-side benchmark: backend alone, plain reverse_proxy, sangho_dedup
# on memory, file and Redis. Writes bench/RESULTS.md. Load comes from wrk,
# installed here if missing and possible; without it sangho-bench falls
# back to its Go generator and says so in the report. One run at a time
# on the machine (flock).
bench:
	mkdir -p bench/out
	command -v wrk >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y wrk; } || { command -v sudo >/dev/null && sudo -n apt-get install -y wrk; } || echo "wrk not installed: the Go load generator will run"
	go build -o bench/out/caddy ./cmd/caddy
	go build -o bench/out/sangho-bench ./cmd/sangho-bench
	flock /tmp/bench.lock ./bench/out/sangho-bench --caddy bench/out/caddy --out bench/RESULTS.md
	flock /tmp/bench.lock go test -run '^$$' -bench . -benchmem -count 3 . ./dedup ./providers ./stores/... | tee bench/go-bench.txt

# The dashboard's panel pictures (monitoring/panels), drawn from a run of
# the real-Prometheus test with 90 s of mixed traffic.
panels:
	MONITORING_PANELS=write go test -count=1 -run TestRealCaddyAndPrometheus ./monitoring
