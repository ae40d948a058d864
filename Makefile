# dataplane: `make run` builds and serves on the embedded defaults; `make test` is the one
# test command (CI runs it through .ci/run). `make help` lists every target.

GO          ?= go
BIN         := bin/dataplane
BUILD       := build
OPENBLAS_DIR := $(CURDIR)/$(BUILD)/openblas/usr/lib/x86_64-linux-gnu/openblas-pthread
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X dataplane/dataplane.Version=$(VERSION)
ARGS        ?=
BENCH       ?= .
BENCH_COUNT ?= 6
BENCH_PKGS  ?= ./...
FUZZTIME    ?= 30s

SOAK_ARGS   ?=

PEERS_ARGS  ?=

.PHONY: help build run test test-long bench bench-peers soak cuda fuzz clean deps-build deps-test deps-peers

help:
	@echo "make build   build bin/dataplane (Go + the C kernels through cgo; needs only gcc)"
	@echo "make run     build, then 'dataplane serve' on the embedded defaults (ARGS='--listen :9000' to change)"
	@echo "make test    go vet, go test -race, the C tests through CMake/ctest, and again under ASan/UBSan"
	@echo "             (installs gcc/cmake if missing)"
	@echo "make test-long  the fleet as processes on loopback: nats-server, two routers, two mock fleets,"
	@echo "             bench load; kills and restarts (minutes; installs nats-server if missing)"
	@echo "make bench   Go benchmarks (BENCH_PKGS, BENCH, BENCH_COUNT) summarised by benchstat, then every C bench_*"
	@echo "make bench-peers  our benchmarks beside PyTorch, Pillow + torchvision, memcpy and a fasthttp"
	@echo "             hello-world, alternating (3 rounds): one table to stdout and build/bench-peers.{md,json}"
	@echo "             (PEERS_ARGS='-cases log-mel -rounds 5' to narrow; installs torch, torchvision, Pillow, OpenBLAS)"
	@echo "make fuzz    every fuzz target for FUZZTIME each (default $(FUZZTIME))"
	@echo "make soak    build, then 'dataplane bench chaos': serve under twelve hostile scenarios (<= 5 min),"
	@echo "             one table, rows also in build/soak.json; fails when a row fails (SOAK_ARGS to add flags)"
	@echo "make cuda    the CUDA plugin (needs a CUDA toolkit; says so when there is none)"
	@echo "make clean   remove bin/ and build/"

# need installs a Debian package when a command it provides is missing: $(call need,command,package)
define need
	@command -v $(1) >/dev/null 2>&1 || { \
	  echo "$(1) not found: installing the Debian package $(2)"; \
	  command -v apt-get >/dev/null 2>&1 || { echo "no apt-get here: install $(2) yourself"; exit 1; }; \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(2); }
endef

# need_file is need for a file a package provides (a header): $(call need_file,path,package)
define need_file
	@test -e $(1) || { \
	  echo "$(1) not found: installing the Debian package $(2)"; \
	  command -v apt-get >/dev/null 2>&1 || { echo "no apt-get here: install $(2) yourself"; exit 1; }; \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(2); }
endef

# need_py is need for a module of Debian's python3: $(call need_py,module,package)
define need_py
	@/usr/bin/python3 -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("$(1)") is None)' 2>/dev/null || { \
	  echo "python3 module $(1) not found: installing the Debian package $(2)"; \
	  command -v apt-get >/dev/null 2>&1 || { echo "no apt-get here: install $(2) yourself"; exit 1; }; \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $(2); }
endef

# Build: gcc, and libjpeg-turbo for the JPEG decoder in native/: TurboJPEG for headers and the
# whole-picture decode, libjpeg's API for the crop-window decode (jpeg_crop_scanline).
deps-build:
	$(call need,gcc,gcc libc6-dev)
	$(call need_file,/usr/include/turbojpeg.h,libturbojpeg0-dev)
	$(call need_file,/usr/include/jpeglib.h,libjpeg62-turbo-dev)

# Test: cmake for the C tests; ffmpeg (and ffprobe) for the media tests that decode audio and
# video containers through it (dataplane/media/audio, dataplane/media/video); Debian's python3
# with zmq, msgpack and torch for the tests that replay, through transfer/testdata/vllm's
# vllm_ref.py, the KV events vLLM publishes for what the daemon hands it (dataplane/api);
# nats-server for the fleet's multi-process tests (make test-long).
deps-test: deps-build
	$(call need,cmake,cmake)
	$(call need,ffmpeg,ffmpeg)
	$(call need_py,zmq,python3-zmq)
	$(call need_py,msgpack,python3-msgpack)
	$(call need_py,torch,python3-torch)
	$(call need,nats-server,nats-server)

build: deps-build
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/dataplane

run: build
	./$(BIN) serve $(ARGS)

# The C build comes first: the Go tests load build/libdataplane_cpu_plugin.so through the real
# plugin loader (package cuda) and run the backend conformance suite through it.
test: deps-test
	cmake -S . -B $(BUILD) -DDATAPLANE_CUDA=AUTO
	cmake --build $(BUILD) --parallel
	$(GO) vet ./...
	DATAPLANE_TEST_PLUGIN=$(CURDIR)/$(BUILD)/libdataplane_cpu_plugin.so $(GO) test -race -count=1 ./...
	# Allocation counts again without -race, whose sync.Pool drops a quarter of what is put back.
	$(GO) test -count=1 -run 'Alloc' ./router/... ./features ./dataplane/api ./dataplane/tokenizer
	ctest --test-dir $(BUILD) --output-on-failure
	cmake -S . -B $(BUILD)/sanitize -DDATAPLANE_CUDA=OFF -DDATAPLANE_SANITIZE=ON
	cmake --build $(BUILD)/sanitize --parallel
	ctest --test-dir $(BUILD)/sanitize --output-on-failure
	$(GO) test -asan -count=1 ./native ./dataplane/encoder

# The fleet as separate processes on loopback (cmd/dataplane/fleet_long_test.go): a real
# nats-server with JetStream, two router replicas, two mock fleets, bench load through the
# routers; a replica killed and restarted, a fleet killed, NATS restarted; and the planner
# (cmd/dataplane/plan_long_test.go) scaling decode and prefill pools of mock engines under a
# load ramp (about a minute). A few minutes of two cores, so not part of `make test`.
test-long: deps-test build
	DATAPLANE_BIN=$(CURDIR)/$(BIN) $(GO) test -tags long -count=1 -timeout 15m -run 'Long' -v ./cmd/dataplane

bench: deps-test
	@mkdir -p $(BUILD)
	$(GO) test -run '^$$' -bench '$(BENCH)' -count $(BENCH_COUNT) $(BENCH_PKGS) | tee $(BUILD)/bench-go.txt
	$(GO) tool benchstat $(BUILD)/bench-go.txt
	cmake -S . -B $(BUILD) -DDATAPLANE_CUDA=AUTO
	cmake --build $(BUILD) --parallel
	@for b in $(BUILD)/bench_*; do echo "== $$b"; $$b || exit 1; done

# The peers (bench/peers/*.py) run on Debian's python3 with torch, torchvision and Pillow;
# torch gets OpenBLAS's pthread build through LD_LIBRARY_PATH (bench/peers sets it), never by
# switching the machine's BLAS alternatives. Heavy, so not part of deps-test.
deps-peers: deps-build
	$(call need_py,torch,python3-torch)
	$(call need_py,torchvision,python3-torchvision)
	$(call need_py,PIL,python3-pil)
	@# OpenBLAS unpacked, not installed: installing libopenblas0-pthread switches the machine's
	@# BLAS alternatives (auto mode), which changes every later measurement.
	@test -e $(OPENBLAS_DIR)/libopenblas.so.0 || { rm -rf $(BUILD)/openblas && mkdir -p $(BUILD)/openblas && cd $(BUILD)/openblas && \
	  { apt-get download libopenblas0-pthread 2>/dev/null || { apt-get update -qq && apt-get download libopenblas0-pthread; }; } && \
	  dpkg-deb -x libopenblas0-pthread_*.deb . && rm -f libopenblas0-pthread_*.deb; }

# Our benchmarks (compiled test binaries) beside their peers, alternating; the cases are
# bench/peers/cases.go. Minutes; not part of `make test`.
bench-peers: deps-peers
	@mkdir -p $(BUILD)
	DATAPLANE_OPENBLAS_DIR=$(OPENBLAS_DIR) $(GO) run ./bench/peers -out $(BUILD)/bench-peers $(PEERS_ARGS)

# A real serve (and mock workers) as child processes under the scenarios of bench/chaos: body
# floods, huge pictures, overload, stuck media, dead workers, SIGTERM, slow headers. Not part of
# `make test` (minutes of two cores); exit status 1 when any row fails.
soak: build
	@mkdir -p $(BUILD)
	./$(BIN) bench chaos --json $(BUILD)/soak.json --logs $(BUILD)/soak-logs $(SOAK_ARGS)

# Go 1.26's fuzz coordinator can report "context deadline exceeded" as -fuzztime ends, with no
# failing input (golang/go#75804, fixed in Go 1.27): such a run is a flake, said so and passed;
# any other failure, or one that wrote a reproducer under testdata/fuzz/, fails the target.
fuzz:
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for pkg in $$($(GO) list ./...); do \
	  dir=$$($(GO) list -f '{{.Dir}}' $$pkg); \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; \
	    before=$$(ls $$dir/testdata/fuzz/$$f 2>/dev/null | wc -l); \
	    if ! $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg >$$log 2>&1; then \
	      after=$$(ls $$dir/testdata/fuzz/$$f 2>/dev/null | wc -l); \
	      if [ "$$after" = "$$before" ] && grep -q 'context deadline exceeded' $$log; then \
	        tail -n 3 $$log; echo "   (the Go 1.26 fuzz-deadline flake, golang/go#75804: no failing input; passed)"; \
	      else cat $$log; exit 1; fi; \
	    else tail -n 2 $$log; fi; \
	  done; \
	done

cuda: deps-test
	@if ! command -v nvcc >/dev/null 2>&1 && [ -z "$$CUDACXX" ]; then \
	  echo "make cuda: no CUDA toolkit here (nvcc not on PATH, CUDACXX unset), so the plugin is not built."; \
	  echo "dataplane builds and runs without it, on the CPU backend."; \
	  exit 1; \
	fi
	cmake -S . -B $(BUILD)/cuda -DDATAPLANE_CUDA=ON
	cmake --build $(BUILD)/cuda --parallel

clean:
	rm -rf bin $(BUILD)
