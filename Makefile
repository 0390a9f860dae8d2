# The two commands of the README, plus the targets they are built from.
#   make demo   install what is missing, build, run the end-to-end demo
#   make test   install what is missing, build, run the whole suite: plain, under ASan+UBSan,
#               and the threaded tests (label tsan) under ThreadSanitizer

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
CTEST_ARGS ?=

CONFIGURE = cmake -S . -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

.PHONY: all deps build build-asan build-tsan demo test test-plain test-asan test-tsan bench fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	$(CONFIGURE) -B $(BUILD)
	cmake --build $(BUILD) -j $(JOBS)

build-asan: deps
	$(CONFIGURE) -B $(ASAN_BUILD) -DIBVX_ASAN=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)

build-tsan: deps
	$(CONFIGURE) -B $(TSAN_BUILD) -DIBVX_TSAN=ON
	cmake --build $(TSAN_BUILD) -j $(JOBS)

demo: build
	@bash scripts/demo.sh $(BUILD)

test-plain: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-asan: build-asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -LE no-asan $(CTEST_ARGS)

test-tsan: build-tsan
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -L tsan $(CTEST_ARGS)

test: test-plain test-asan test-tsan

# The full ibv-extend-perf run (minutes): bench/results.json and docs/BENCHMARKS.md.
bench: build
	@bash bench/run.sh $(BUILD)

# libFuzzer runs of every fuzz target (clang build in build-fuzz); FUZZ_SECONDS per target.
fuzz: deps
	@bash tests/fuzz/run-fuzz.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
