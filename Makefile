# Entry points for working on crew. Build settings live in CMakePresets.json;
# each target installs what it needs with scripts/deps.sh first.
#   make run | test | image | compose | compose-down | bench | bench-overload | screenshots |
#        tsan | asan | stress | fuzz | tidy-build | format | clean
# JOBS=N overrides the presets' -j2 for builds and ctest.
# make stress runs the concurrency tests many times in a row (each case x20
# in build/, x3 under TSan in build-tsan/; model_test's random programs
# 20,000 and 2,000 times); SINCE=<git ref> limits it to the test files
# changed since that ref (scripts/stress.sh).
# All use build/ except the sanitizer and clang builds; only `make bench`
# turns the benchmarks (and their extra libraries) on there.

MAKEFLAGS += --no-print-directory
DEPS := bash scripts/deps.sh
JOBS ?=
J := $(if $(JOBS),-j $(JOBS))
FORMAT_DIRS := include src tests bench examples service tools

BENCH_OVERLOAD_ARGS ?=

.PHONY: all run test image compose compose-down bench bench-overload screenshots tsan asan \
	stress fuzz \
	tidy-build format clean

all: test

# crewd with its defaults on 127.0.0.1:8080 (docs/crewd.md); Ctrl-C stops it.
run:
	$(DEPS) build
	bash scripts/configure.sh default
	cmake --build --preset default $(J) --target crewd
	./build/service/crewd

test:
	$(DEPS) test
	bash scripts/configure.sh default
	cmake --build --preset default $(J)
	bash scripts/ctest.sh build --preset default $(J)

# crewd's container image from deploy/Dockerfile (CREWD_IMAGE, crewd:0.1.0 by
# default) with docker, or podman when no docker daemon answers; the debian:12
# base is made with debootstrap when no registry serves it. Quiet when nothing
# changed (scripts/image.sh).
image:
	$(DEPS) image
	bash scripts/image.sh

# The local stack of deploy/compose/compose.yaml, detached: two crewd
# instances sharing jobs through Redis and Prometheus scraping both with
# deploy/monitoring/rules; returns once all answer and prints their
# addresses. (Re)builds the images first (quiet when nothing changed) and
# restarts a running stack. compose-down stops it and removes everything it
# made. docker compose with a docker daemon, else podman-compose
# (scripts/compose.sh).
compose:
	$(DEPS) image
	bash scripts/compose.sh up

compose-down:
	$(DEPS) image
	bash scripts/compose.sh down

bench:
	$(DEPS) bench
	bash scripts/configure.sh bench
	cmake --build --preset bench $(J) --target crew_bench
	./build/bench/crew_bench --json build/bench-results.json
	python3 bench/report.py build/bench-results.json

# crewd under overload with the open-loop generator bench/loadgen
# (docs/bench/overload.md): crewd on CPU 0, loadgen on CPU 1; the options
# of bench/overload/run.py in BENCH_OVERLOAD_ARGS (--rounds, --duration, ...).
# The console's screenshots in docs/img/, taken by its browser test.
screenshots:
	$(DEPS) test
	bash scripts/configure.sh default
	cmake --build --preset default $(J) --target crewd
	ctest --test-dir build -R 'crewd_console_test.page$$' --output-on-failure
	cp build/service/tests/shots/console-*.png docs/img/

bench-overload:
	$(DEPS) bench
	bash scripts/configure.sh default
	cmake --build --preset default $(J) --target crewd loadgen
	python3 bench/overload/run.py --plot build/bench-overload/overload.png $(BENCH_OVERLOAD_ARGS)

# Sanitizer runs. The sanitizers' options and tests/support/tsan.supp are compiled
# into each executable of these builds (cmake/sanitizer_defaults.cpp.in), so
# a test run by hand or by plain ctest in build-tsan/ or build-asan/ gets
# them too; TSAN_OPTIONS and the like in the environment override them.
tsan asan:
	$(DEPS) test
	bash scripts/configure.sh $@
	cmake --build --preset $@ $(J)
	bash scripts/ctest.sh build-$@ --preset $@ $(J)

# The concurrency tests, each case 20 times in build/ and 3 times under TSan
# (RELEASE_REPEAT, TSAN_REPEAT override); SINCE=<git ref>: only the test
# files changed since then.
stress:
	$(DEPS) test
	$(if $(JOBS),JOBS=$(JOBS)) bash scripts/stress.sh $(if $(SINCE),--since $(SINCE))

# libFuzzer on crewd's request layer (service/fuzz/: raw bytes through the
# HTTP parser, the router and the job parser), clang++ with ASan and
# UBSan in build-fuzz/, for FUZZ_SECONDS in FUZZ_JOBS processes at once
# (libFuzzer's -fork; they share the corpus); new inputs go to
# build-fuzz/corpus.
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 2
fuzz:
	$(DEPS) test
	cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DCREWD_FUZZ=ON -DCREW_BUILD_TESTS=OFF -DCREW_BUILD_BENCH=OFF -DCREW_BUILD_EXAMPLES=OFF
	cmake --build build-fuzz $(or $(J),-j 2) --target crewd_request_fuzzer
	mkdir -p build-fuzz/corpus
	./build-fuzz/service/fuzz/crewd_request_fuzzer -fork=$(FUZZ_JOBS) -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	  -print_funcs=0 -rss_limit_mb=2048 -print_final_stats=1 -dict=service/fuzz/request.dict \
	  build-fuzz/corpus service/fuzz/corpus

# clang++ build with -Wthread-safety (from crew's warning flags) and -Werror,
# without a sanitizer (CI gets the same warnings from `make asan`, whose
# preset builds on this one). TIDY_TARGETS limits it (the libraries and
# crewd hold the lock annotations); empty builds everything, tests included.
TIDY_TARGETS ?=
tidy-build:
	$(DEPS) test
	bash scripts/configure.sh clang
	cmake --build --preset clang $(J) $(if $(TIDY_TARGETS),--target $(TIDY_TARGETS))

format:
	$(DEPS) format
	find $(FORMAT_DIRS) -type f \( -name '*.hpp' -o -name '*.cpp' -o -name '*.h' \) \
	  -print0 2>/dev/null | xargs -0 -r clang-format -i

clean:
	rm -rf build build-tsan build-asan build-clang build-fuzz build-image
