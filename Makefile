# commbench from a fresh clone:
#   make          set up .venv (once) and run the quick scaling study on as many workers
#                 as the machine has cores; ends with the chart's path
#   make test     run the tests in that environment (and the engines', once built), in
#                 tiers: fast, job, mpi (make test-fast, test-job, test-mpi: one tier)
#   make engines  build Horovod into .venv and the Bluefog environment (.venv-bluefog)
#   make clean    remove the environments, results/ and charts/
# A second `make` skips what is done. TORCH=cpu (or cu118, cu124, cu126, ...) installs
# that build of torch from PyTorch's own wheel index; the default takes PyPI's build.

PYTHON ?= python3
VENV ?= .venv
BLUEFOG_VENV ?= .venv-bluefog
TORCH ?= pypi
TORCH_VERSION ?= 2.14.1
TORCHVISION_VERSION ?= 0.29.1
PYTEST_ARGS ?= -rs

BIN := $(VENV)/bin
ENV_DONE := $(VENV)/.commbench-env
ENGINES_DONE := $(VENV)/.commbench-engines
ifeq ($(TORCH),pypi)
TORCH_INDEX :=
else
TORCH_INDEX := --index-url https://download.pytorch.org/whl/$(TORCH)
endif
# Open MPI refuses to start as root without these; harmless for other users.
ROOT_OK := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# No more workers than cores (more would measure CPU sharing, and the sweep leaves them
# out): 1,2 on 2 or 3 cores, 1,2,4 from 4. nproc counts hardware threads; where they
# outnumber the physical cores, the sweep leaves out what does not fit, saying so.
# Machines of one worker, so that hierarchical_neighbor_allreduce has two machines from
# 2 workers on.
QUICK_NP := $(shell n=$$(nproc 2>/dev/null || echo 1); \
    if [ "$$n" -ge 4 ]; then echo 1,2,4; elif [ "$$n" -ge 2 ]; then echo 1,2; else echo 1; fi)
QUICK_STUDY := --quick --np $(QUICK_NP) --machine-size 1 \
    --dist-optimizer allreduce,neighbor_allreduce,hierarchical_neighbor_allreduce,none

.PHONY: all study env test test-fast test-job test-mpi engines clean
all: study

env: $(ENV_DONE)

# A new environment needs room: PyPI's torch brings its CUDA libraries (~6 GiB in .venv,
# more while pip unpacks); a full disk would stop pip halfway.
ENV_GIB ?= $(if $(filter pypi,$(TORCH)),10,3)

$(ENV_DONE): pyproject.toml
	@test -x $(BIN)/python || { free=$$(df -Pk . | awk 'NR == 2 {print int($$4 / 1048576)}'); \
	    [ "$$free" -ge $(ENV_GIB) ] || { echo "commbench: error: setting up $(VENV) needs" \
	    "about $(ENV_GIB) GiB free on this disk; $$free GiB are free" >&2; exit 1; }; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(TORCH_INDEX) torch==$(TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)
	$(BIN)/pip install -e ".[mpi,lm,test]"
	$(BIN)/commbench setup-mpirun
	touch $@

study: $(ENV_DONE)
	$(ROOT_OK) $(BIN)/commbench sweep $(QUICK_STUDY)

$(ENGINES_DONE): $(ENV_DONE) scripts/install_horovod.sh scripts/setup_bluefog_env.sh
	PATH="$(abspath $(BIN)):$$PATH" VIRTUAL_ENV="$(abspath $(VENV))" bash scripts/install_horovod.sh
	$(BIN)/pip install -e ".[mpi,test,horovod]"
	rm -rf $(BLUEFOG_VENV)
	bash scripts/setup_bluefog_env.sh $(BLUEFOG_VENV)
	touch $@

engines: $(ENGINES_DONE)

# The tests in tiers (docs/install.md, "The tests"): fast starts no process but cheap
# tools (and runs ruff), job starts Python processes but no launcher, mpi starts jobs
# through launchers. `make test` runs the three in that order, each timed, then the
# times; it runs every tier and fails if any failed. With the engines built, their tests
# are mandatory (a skipped engine test fails), and commbench's core is tested again on
# the Bluefog environment's Python 3.9 + torch 1.10. A PYTEST_ARGS with its own -m picks
# the tests itself: then `make test` runs that one selection instead of the tiers.
FAST := -m "not job and not mpi"
JOB := -m "job and not mpi"
# The slowest launcher tests are listed at the tier's end: what a cold CI run spends.
# The tier runs in MPI_WORKERS pytest-xdist workers, each taking whole groups
# (tests/conftest.py): much of a launcher test's time is waiting (for a timeout, a rank,
# a restart). MPI_WORKERS=1 runs it serially (docs/install.md, "The tests").
MPI_WORKERS ?= 2
MPI := -m mpi --durations=20 $(if $(filter-out 1,$(MPI_WORKERS)),-n $(MPI_WORKERS) --dist loadgroup)
TIER := bash scripts/tier.sh
PYTEST := $(BIN)/python -m pytest $(PYTEST_ARGS)
OWN_SELECTION := $(filter -m -m%,$(PYTEST_ARGS))
ifneq ($(wildcard $(ENGINES_DONE)),)
TEST_ENV := $(ROOT_OK) COMMBENCH_REQUIRE_ENGINES=1 \
    COMMBENCH_BLUEFOG_PYTHON="$(abspath $(BLUEFOG_VENV))/bin/python"
BLUEFOG_ENV := $(ROOT_OK) COMMBENCH_REQUIRE_ENGINES=0
BLUEFOG_PYTEST := $(BLUEFOG_VENV)/bin/python -m pytest $(PYTEST_ARGS)
NOT_ENGINES := --ignore tests/test_bluefog.py --ignore tests/test_horovod.py
BLUEFOG_TIERS := \
    $(BLUEFOG_ENV) $(TIER) bluefog-fast -- $(BLUEFOG_PYTEST) $(FAST) $(NOT_ENGINES) || rc=1; \
    $(BLUEFOG_ENV) $(TIER) bluefog-job -- $(BLUEFOG_PYTEST) $(JOB) $(NOT_ENGINES) || rc=1; \
    $(BLUEFOG_ENV) $(TIER) bluefog-mpi -- $(BLUEFOG_PYTEST) $(MPI) \
        tests/test_run_mpi.py tests/test_microbench.py tests/test_bad_input.py || rc=1;
else
TEST_ENV := $(ROOT_OK)
BLUEFOG_TIERS :=
endif

test: $(ENV_DONE)
ifneq ($(OWN_SELECTION),)
	$(TEST_ENV) $(TIER) selected -- $(PYTEST)
else
	@own_log=$$(mktemp); export TIER_LOG="$${TIER_LOG:-$$own_log}"; rc=0; \
	$(TEST_ENV) $(TIER) fast -- $(PYTEST) $(FAST) || rc=1; \
	$(TEST_ENV) $(TIER) job -- $(PYTEST) $(JOB) || rc=1; \
	$(TEST_ENV) $(TIER) mpi -- $(PYTEST) $(MPI) || rc=1; \
	$(BLUEFOG_TIERS) \
	echo "timed stages:"; $(TIER) --summary; rm -f "$$own_log"; exit $$rc
endif

test-fast: $(ENV_DONE)
	$(TEST_ENV) $(TIER) fast -- $(PYTEST) $(FAST)

test-job: $(ENV_DONE)
	$(TEST_ENV) $(TIER) job -- $(PYTEST) $(JOB)

test-mpi: $(ENV_DONE)
	$(TEST_ENV) $(TIER) mpi -- $(PYTEST) $(MPI)

clean:
	rm -rf $(VENV) $(BLUEFOG_VENV) results charts build dist *.egg-info
