# commbench from a fresh clone:
#   make          set up .venv (once) and run the quick scaling study; ends with the chart
#   make test     run the tests in that environment (and the engines', once built)
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
QUICK_STUDY := --quick --np 1,2,4 --machine-size 2 \
    --dist-optimizer allreduce,neighbor_allreduce,hierarchical_neighbor_allreduce,none

.PHONY: all study env test engines clean
all: study

env: $(ENV_DONE)

$(ENV_DONE): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(TORCH_INDEX) torch==$(TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)
	$(BIN)/pip install -e ".[mpi,test]"
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

# With the engines built, their tests are mandatory (a skipped engine test fails), and
# commbench's core is tested again on the Bluefog environment's Python 3.9 + torch 1.10.
test: $(ENV_DONE)
ifneq ($(wildcard $(ENGINES_DONE)),)
	$(ROOT_OK) COMMBENCH_REQUIRE_ENGINES=1 COMMBENCH_BLUEFOG_PYTHON="$(abspath $(BLUEFOG_VENV))/bin/python" \
	    $(BIN)/python -m pytest $(PYTEST_ARGS)
	$(ROOT_OK) COMMBENCH_REQUIRE_ENGINES=0 $(BLUEFOG_VENV)/bin/python -m pytest $(PYTEST_ARGS) \
	    -m "not mpi" --ignore tests/test_bluefog.py --ignore tests/test_horovod.py
	$(ROOT_OK) COMMBENCH_REQUIRE_ENGINES=0 $(BLUEFOG_VENV)/bin/python -m pytest $(PYTEST_ARGS) \
	    -m mpi tests/test_run_mpi.py tests/test_microbench.py tests/test_bad_input.py
else
	$(ROOT_OK) $(BIN)/python -m pytest $(PYTEST_ARGS)
endif

clean:
	rm -rf $(VENV) $(BLUEFOG_VENV) results charts build dist *.egg-info
