# slicetrain build.
#   make            build build/slicetrain, the tests and the benchmarks that need no MPI
#   make test       build and run the whole test suite (ends "N passed, N failed, N skipped")
#   make san        the same suite built with ASan+UBSan, in $(BUILD)-san/
#   make check      the default suite (CI): the optimized build's suite, the sanitized one,
#                   and the kernels' tests on a build without AVX-512 ($(BUILD)-noavx512/);
#                   make -jN runs N tests at a time (docs/testing.md)
#   make run        the main job: the embedded default as an elastic run on 2 slices, one preempted
#   make data       the default job's token files (data/default/*.bin; install-deps.sh made the rest)
#   make bench      build the benchmark programs (bench/README.md; needs openmpi for mpi_allreduce)
#   make tokenizer-parity  the tokenizer against Hugging Face's on 10 MB of text (docs/data.md)
#   make test-ray   the Ray and Kubernetes tests on local Ray clusters (docs/ray.md; opt-in)
#   make clean
CC      ?= cc
BUILD   ?= build
OPT     ?= -O2 -march=native
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -Isrc -MMD -MP
LDLIBS  += -ldnnl -lyaml -ljansson -lisal -lz -lcrypto -lm -fopenmp
LDLIBS  += -lpcre2-8 # src/text: the tokenizer's pre-tokenizer regexes

# SAN=1: the sanitized build, in build-san/ unless BUILD is given
# (make SAN=1 BUILD=build-x-san)
ifeq ($(SAN),1)
ifneq ($(origin BUILD),command line)
BUILD   := build-san
endif
OPT     := -O1 -march=native -fno-omit-frame-pointer
CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

LIB_SRC  := $(shell find src -name '*.c' ! -path 'src/cli/*' | sort)
CLI_SRC  := $(shell find src/cli -name '*.c' | sort)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# every benchmark but mpi_allreduce (openmpi): built with the rest, so that they keep compiling
BENCH    := $(BUILD)/bench/collectives $(BUILD)/bench/train_step $(BUILD)/bench/attention $(BUILD)/bench/restore

all: $(BUILD)/slicetrain $(TESTS) $(BENCH)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libslicetrain.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/slicetrain: $(CLI_OBJ) $(BUILD)/libslicetrain.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/libslicetrain.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Tests run ST_JOBS at a time: make's -jN (none: 1), unless ST_JOBS is set.
ST_JOBS ?= $(or $(patsubst -j%,%,$(filter -j%,$(MAKEFLAGS))),1)

test: all data
	ST_JOBS=$(ST_JOBS) BUILDS=$(BUILD) tests/run.sh

san:
	$(MAKE) SAN=1 BUILD=$(BUILD)-san test

# The default suite (docs/testing.md; .ci/run runs it): the optimized build,
# the sanitized one ($(BUILD)-san) and one without AVX-512 ($(BUILD)-noavx512:
# the kernels' scalar paths, issue 14), built side by side with the fuzz
# targets (for tests/cli/fuzz_short: best effort, the test says why they do
# not build); then every test on the first two builds and NOAVX512_TESTS on
# the third, ST_JOBS at a time (make -j2 check: 2).
NOAVX512_OPT   := $(OPT) -mno-avx512f
NOAVX512_TESTS := test_ cli/mesh_ cli/resume_bitexact cli/oracle_adamw cli/hf_torch_ref cli/train_ \
	cli/generate cli/eval
check: check-build
	$(MAKE) data
	ST_JOBS=$(ST_JOBS) BUILDS="$(BUILD) $(BUILD)-san $(BUILD)-noavx512:$(subst $(space),$(comma),$(strip $(NOAVX512_TESTS)))" \
		tests/run.sh

# Each build says how long it took (its own wall time; they run side by side).
timed = t0=$$(date +%s.%N); $(1); rc=$$?; \
	echo "make check: $(2) $$([ $$rc = 0 ] && echo built || echo FAILED) in $$(awk -v a=$$t0 -v b=$$(date +%s.%N) \
	'BEGIN { printf "%.0f", b - a }') s"; [ $$rc = 0 ]
check-build: check-build-opt check-build-san check-build-noavx512 check-build-fuzz
check-build-opt:
	@$(call timed,$(MAKE) all,$(BUILD)/)
check-build-san:
	@$(call timed,$(MAKE) SAN=1 BUILD=$(BUILD)-san all,$(BUILD)-san/)
check-build-noavx512:
	@$(call timed,$(MAKE) BUILD=$(BUILD)-noavx512 OPT='$(NOAVX512_OPT)' all,$(BUILD)-noavx512/)
check-build-fuzz:
	@mkdir -p $(FUZZ_BUILD) && command -v $(FUZZ_CC) >/dev/null && \
		{ $(call timed,$(MAKE) fuzz >$(FUZZ_BUILD)/make.log 2>&1,$(FUZZ_BUILD)/ (the fuzz targets)); } || \
		echo "make check: the fuzz targets did not build ($(FUZZ_BUILD)/make.log); tests/cli/fuzz_short says why"

# Every kernel source compiled for every CPU target with gcc and clang
# (scripts/kernels-compile.sh; tests/cli/kernels_compile runs it in the suite)
kernels-compile:
	JOBS=$(ST_JOBS) bash scripts/kernels-compile.sh
.PHONY: kernels-compile
empty :=
space := $(empty) $(empty)
comma := ,

# The default job's data (data/default/, docs/data.md): made by
# scripts/install-deps.sh (Debian's fortunes, a held-out split, a tokenizer
# trained on them); the token files on first use, by slicetrain tokenize.
data: $(BUILD)/slicetrain
	bash scripts/default-data.sh $(BUILD)/slicetrain

# The default job's learning criterion in full (100 steps, 2-4 minutes):
# its eval loss ends 1 nat below its first eval and below the unigram entropy
check-default-job: all data
	ST_DEFAULT_JOB=full BUILDS=$(BUILD) tests/run.sh cli/default_job

# The main job: the embedded default (configs/default.yml) as an elastic run
# on 2 slices of 1 device; slice 1 gets a preemption notice after step 10 and
# comes back 5 s later; the run ends with the elastic summary line. It starts
# afresh each time (its own output directory, slicetrain_output/default, is
# removed first: a kept one would resume and find its steps done).
run: data
	@echo "make run: starting the default job afresh (removing slicetrain_output/default)"
	rm -rf slicetrain_output/default
	OMP_NUM_THREADS=1 $(BUILD)/slicetrain launch --num-slices 2 --min-slices 1 --devices-per-slice 1 \
		--preempt 1@30:5 --

$(BUILD)/bench/%: bench/%.c $(BUILD)/libslicetrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libslicetrain.a $(LDLIBS)

$(BUILD)/bench/mpi_allreduce: bench/mpi_allreduce.c bench/bench_args.h
	@mkdir -p $(dir $@)
	mpicc -O2 -o $@ $<

bench: $(BUILD)/slicetrain $(BENCH) $(BUILD)/bench/mpi_allreduce

# the long elastic harnesses of issue 10 (opt-in; bench/README.md): FAULTS=N
# (default 100, or kinds) for the soak; INTERVAL, DURATION for goodput
soak: $(BUILD)/slicetrain
	BUILD=$(BUILD) bench/elastic_soak.sh

goodput: $(BUILD)/slicetrain
	BUILD=$(BUILD) bench/elastic_goodput.sh

# Fuzzing (issue 11; fuzz/README.md): every fuzz/fuzz_*.c is a libFuzzer
# target, built by clang with ASan+UBSan in build-fuzz/ against the library
# compiled there with fuzzer coverage. make fuzz-run runs each FUZZ_SECONDS
# (default 600) on its corpus (build-fuzz/corpus/NAME, seeded from
# fuzz/seeds/NAME/); a crash fails it and names the reproducer.
# make hostile: HOSTILE_MESSAGES (default 10000) random and mutated messages
# to every listening port of an elastic run, then HOSTILE_FLOOD (200) silent
# connections per port (bench/README.md).
FUZZ_CC      ?= clang
FUZZ_BUILD   := build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_CFLAGS  := -O1 -g -march=native -fno-omit-frame-pointer -std=c11 -D_GNU_SOURCE -Wall -Wextra \
	-Wno-unused-parameter -Wno-pass-failed -fopenmp -Isrc -MMD -MP -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_SRC     := $(wildcard fuzz/fuzz_*.c)
FUZZ_BIN     := $(FUZZ_SRC:fuzz/%.c=$(FUZZ_BUILD)/%)
# one library for every target, of the code they reach: the parsers of
# network input and what they link (src/base, src/comm, src/elastic), not
# the model and kernels (a link error says when a target needs more)
FUZZ_LIB_SRC := $(filter src/base/% src/comm/% src/elastic/%,$(LIB_SRC))
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_BUILD)/%.o)

$(FUZZ_BUILD)/src/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/libslicetrain.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c $(FUZZ_BUILD)/libslicetrain.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_BUILD)/libslicetrain.a $(LDLIBS)

fuzz: $(FUZZ_BIN)

fuzz-run: fuzz
	FUZZ_BUILD=$(FUZZ_BUILD) fuzz/run.sh $(FUZZ_SECONDS)

fuzz-clean:
	rm -rf $(FUZZ_BUILD)

HOSTILE_MESSAGES ?= 10000
HOSTILE_FLOOD    ?= 200
hostile: $(BUILD)/slicetrain
	BUILDS=$(BUILD) HOSTILE_MESSAGES=$(HOSTILE_MESSAGES) HOSTILE_FLOOD=$(HOSTILE_FLOOD) ST_TEST_TIMEOUT=1800 \
		tests/run.sh cli/hostile_ports

.PHONY: fuzz fuzz-run fuzz-clean hostile
-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_BIN:=.d)

# Tokenizer parity at scale (issue 15; docs/data.md): tests/cli/tokenize_parity on
# PARITY_MB (default 10) MB of varied text: ids identical to Hugging Face
# tokenizers', decode too, and the speed of both on one thread with the CPU.
PARITY_MB ?= 10
tokenizer-parity: $(BUILD)/slicetrain $(BUILD)/tests/test_tokenizer
	ST_ROOT=$(CURDIR) SLICETRAIN=$(CURDIR)/$(BUILD)/slicetrain ST_SAN_REPORT='^==[0-9]+==ERROR' \
		PARITY_MB=$(PARITY_MB) bash tests/cli/tokenize_parity.sh

.PHONY: tokenizer-parity

# The Ray and Kubernetes tests (issue 12; docs/ray.md), opt-in: real local Ray
# clusters (deploy/ray/local-cluster.sh: a head and 2 one-CPU nodes in a
# network namespace of their own) and deploy/k8s's manifests validated
# offline; they need .venv-ray (scripts/install-deps.sh --ray); ~10 minutes.
# the longer scenarios on test hosts (network namespaces; root): tests/hosts/
test-hosts: $(BUILD)/slicetrain
	ST_SH_DIRS=tests/hosts BUILDS=$(BUILD) tests/run.sh

.PHONY: test-hosts

test-ray: $(BUILD)/slicetrain
	BUILD=$(BUILD) tests/ray/run.sh

.PHONY: test-ray

clean:
	rm -rf $(BUILD) $(BUILD)-san $(BUILD)-noavx512

.PHONY: all test san check check-build check-build-opt check-build-san check-build-noavx512 check-build-fuzz
.PHONY: check-default-job run data bench clean soak goodput
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TESTS:=.d) $(BENCH:=.d)
