# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Two pytest-xdist workers, whole files per worker (module fixtures are built once): most of the suite's time is
# XLA compiling, one core per compile, so two workers use both cores of the CI machine. PYTEST_WORKERS=0: one process.
# --no-loadscope-reorder: files are handed out in collection order, where tests/conftest.py puts the files with a
# slow test first (xdist's default hands out the files with the most tests first: the one-test demo recipe last).
PYTEST_WORKERS ?= 2
# tools/aot_tpu.py (and its test) compile for TPU topologies on a CPU machine and need libtpu. With libtpu
# installed every plain `import jax` probes for a TPU (errors and a ~4 s wait), so it is kept out of .venv: it
# lives alone in .venv-tpu, whose .pth file adds .venv's site-packages (one copy of everything else, searchjax's
# editable install included).
TPU_VENV := .venv-tpu
TPU_PY := $(TPU_VENV)/bin/python
TPU_STAMP := $(TPU_VENV)/.installed

.PHONY: demo test install tpu-env clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when the project's dependency list changes. torch==2.13.0 (CPU) is a test/tool dependency only.
# JetStream 0.2.2 goes in with --no-deps: its seqio dependency would pull TensorFlow; the light packages its
# engine API and orchestrator import are runtime dependencies in pyproject.toml. A libtpu left in .venv by an
# older Makefile is removed (see TPU_VENV).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps google-jetstream==0.2.2
	$(PY) -m pip uninstall --quiet --yes libtpu 2>/dev/null || true
	touch $(STAMP)

# The libtpu that the installed jax's `tpu` extra names (the `tpu` extra of pyproject.toml), alone in .venv-tpu.
$(TPU_STAMP): $(STAMP)
	$(PY) -m venv $(TPU_VENV)
	echo '*' > $(TPU_VENV)/.gitignore
	$(PY) -c "import site; print(f'import site; site.addsitedir({site.getsitepackages()[0]!r})')" > \
		"$$($(TPU_PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/searchjax-venv.pth"
	$(TPU_PY) -m pip install --quiet --no-deps --ignore-installed "$$($(PY) -c 'import importlib.metadata as m; \
		print(next(r.split(";")[0] for r in m.requires("jax") if r.startswith("libtpu")))')"
	touch $(TPU_STAMP)

install: $(STAMP)

tpu-env: $(TPU_STAMP)

demo: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/searchjax pipeline --config configs/pipeline/demo.yaml --out runs/demo

# tests/model/test_aot_tpu.py runs tools/aot_tpu.py with SEARCHJAX_TPU_PYTHON; everything else runs in .venv.
test: $(STAMP) $(TPU_STAMP)
	JAX_PLATFORMS=cpu SEARCHJAX_TPU_PYTHON=$(abspath $(TPU_PY)) $(PY) -m pytest \
		$(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(TPU_VENV) .pytest_cache .hypothesis
