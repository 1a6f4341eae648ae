# jetflow developer tasks. `make test` is what CI runs (see .ci/run).
GO ?= go
PKGS := ./...

.PHONY: all test race lint vet fmt bench bench-quick run stress

all: lint test

# The README's test command: every package, race detector on, fresh
# results; then the checks module (checks/), as CI runs it.
test:
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	cd checks && $(GO) test -race -count=1 -timeout 30m ./...

race: test

vet:
	$(GO) vet $(PKGS)
	cd checks && $(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

# gofmt and go vet always; staticcheck when installed
# (go install honnef.co/go/tools/cmd/staticcheck@latest).
lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@if command -v staticcheck >/dev/null 2>&1; then staticcheck $(PKGS); else echo "staticcheck not installed; skipped"; fi

# Engine figures next to the raw JetStream limits of the same run.
bench:
	$(GO) run ./bench

bench-quick:
	$(GO) run ./bench --quick

# The main job: a worker with the embedded NATS server and the example workflows.
run:
	$(GO) run ./cmd/worker

# The fault and cluster tests, 5 rounds with the race detector while a CPU
# hog keeps both cores busy (scripts/stress.sh; JETFLOW_STRESS_RUNS=n).
# The durable-sleep fault test runs its full 1,000 sleeping runs here
# (JETFLOW_SLEEP_RUNS; 200 by default, in CI).
stress: export JETFLOW_SLEEP_RUNS ?= 1000
stress:
	./scripts/stress.sh
