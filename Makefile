# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Re-install when the project's dependency list changes. torch==2.13.0 (CPU) is a test/tool dependency only.
# The `tpu` extra adds libtpu so that tools/aot_tpu.py (and its test) can compile for TPU pods on this CPU machine;
# everything else runs with JAX_PLATFORMS=cpu.
# JetStream 0.2.2 goes in with --no-deps: its seqio dependency would pull TensorFlow; the light packages its
# engine API and orchestrator import are runtime dependencies in pyproject.toml.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".[dev,tpu]"
	$(PY) -m pip install --quiet --no-deps google-jetstream==0.2.2
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/searchjax demo --overwrite

test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
