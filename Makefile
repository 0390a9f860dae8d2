# The two commands of the README, plus the targets they are built from.
#   make demo   install what is missing, build, run the end-to-end demo
#   make test   install what is missing, build, run the whole suite: plain, under ASan+UBSan,
#               and the threaded tests (label tsan) under ThreadSanitizer, and the aarch64
#               cross build and its suite under qemu-user (docs/arm64.md)

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
ARM64_BUILD ?= build-arm64
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
CTEST_ARGS ?=

CONFIGURE = cmake -S . -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

# The aarch64 suite under qemu-user, less what cannot run there, which is listed first:
#   no-qemu       tests of behaviour qemu-user 7.2 gets wrong (docs/arm64.md says which and why);
#   needs-binfmt  without a binfmt_misc handler for aarch64 an emulated program cannot exec
#                 another aarch64 program: the tests that start one.
ARM64_BINFMT = $(shell grep -q '^IBVX_BINFMT_AARCH64:BOOL=ON' $(ARM64_BUILD)/CMakeCache.txt 2>/dev/null && echo yes)
ARM64_SKIP = no-qemu$(if $(ARM64_BINFMT),,|needs-binfmt)
ARM64_CTEST = $(call run_ctest,$(ARM64_BUILD),-LE '^($(ARM64_SKIP))$$' $(CTEST_ARGS))

# ctest in the build dir $(1) with the arguments $(2). On a failure the failed tests' first
# failures are printed last (scripts/ctest-digest.py), where a reader of the run's end sees them,
# not only their names: a failing integration test's output is mostly the broker's log.
run_ctest = ctest --test-dir $(1) --output-on-failure --output-junit $(abspath $(1))/ctest-junit.xml \
  -j $(JOBS) $(2) || { rc=$$?; python3 scripts/ctest-digest.py $(abspath $(1))/ctest-junit.xml; exit $$rc; }

.PHONY: all deps deps-arm64 build build-asan build-tsan build-arm64 demo test test-plain test-asan \
        test-tsan test-arm64 bench fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	$(CONFIGURE) -B $(BUILD)
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	$(CONFIGURE) -B $(ASAN_BUILD) -DIBVX_ASAN=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)

# Only what the TSan suite runs (the tsan-labelled tests and the drivers they load).
build-tsan: deps
	$(CONFIGURE) -B $(TSAN_BUILD) -DIBVX_TSAN=ON
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target ibvx_tsan_tests

deps-arm64:
	@bash scripts/install-deps.sh --arm64

# Cross build (the host's protoc and grpc_cpp_plugin generate the code); nice: it is long.
build-arm64: deps-arm64
	$(CONFIGURE) -B $(ARM64_BUILD) -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/toolchain-aarch64.cmake
	nice -n 10 cmake --build $(ARM64_BUILD) -j $(JOBS)
	@file -L $(ARM64_BUILD)/daemon/ibv-extendd

demo: build
	@bash scripts/demo.sh $(BUILD)

test-plain: build
	$(call run_ctest,$(BUILD),$(CTEST_ARGS))

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(call run_ctest,$(ASAN_BUILD),-LE no-asan $(CTEST_ARGS))

test-tsan: build-tsan
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  $(call run_ctest,$(TSAN_BUILD),-L tsan $(CTEST_ARGS))

test-arm64: build-arm64
	@echo "test-arm64: not run under qemu-user 7.2 (label no-qemu, see docs/arm64.md):"
	@ctest --test-dir $(ARM64_BUILD) -N -L '^no-qemu$$' | grep 'Test *#' || true
	@if [ -z "$(ARM64_BINFMT)" ]; then \
	  echo "test-arm64: no binfmt_misc handler for aarch64, so the tests that exec another aarch64 program are not run:"; \
	  echo "  the folders not even built (tests/CMakeLists.txt), then the tests labelled needs-binfmt:"; \
	  sed 's/^/  /' $(ARM64_BUILD)/skipped-test-dirs.txt; \
	  ctest --test-dir $(ARM64_BUILD) -N -L '^needs-binfmt$$' | grep 'Test *#' || true; \
	fi
	$(ARM64_CTEST)

test: test-plain test-asan test-tsan test-arm64

# The full ibv-extend-perf run (minutes): bench/results.json and docs/BENCHMARKS.md.
bench: build
	@bash bench/run.sh $(BUILD)

# libFuzzer runs of every fuzz target (clang build in build-fuzz); FUZZ_SECONDS per target.
fuzz: deps
	@bash tests/fuzz/run-fuzz.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(ARM64_BUILD)
