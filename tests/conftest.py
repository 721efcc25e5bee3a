"""Test-wide JAX set-up: CPU only, 8 fake devices for sharding tests, and a persistent compilation cache (all set
before JAX initialises)."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# Most of the suite's time is XLA compiling the same tiny-model programs again: in another test module (the fixture
# below drops the in-memory caches between modules) or in a subprocess (every CLI test starts one). JAX's persistent
# compilation cache keeps each compile that took >= 1 s (jax_persistent_cache_min_compile_time_secs) on disk, keyed
# by the program, its devices and the jax/XLA version, so an identical compile anywhere in the suite becomes a file
# read. One fresh folder per run: made here by the pytest process that loads this file first (under xdist, the
# controller, whose environment the workers and every test's subprocess inherit) and removed when it ends. An entry
# that two processes write at once can be read half-written: jax then warns and compiles (never a wrong program).
# JAX_COMPILATION_CACHE_DIR set by the caller is used as it is (kept across runs; not removed).
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="searchjax-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE


import gc  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """Drop every compiled executable after each test module. Each XLA CPU executable keeps ~3 memory mappings, and
    the suite compiles ~20,000 of them: in one process that passes the kernel's vm.max_map_count (65,530), after
    which mmap fails inside the compiler and the process segfaults. Later modules recompile what they use."""
    yield
    import jax

    jax.clear_caches()
    gc.collect()


def pytest_collection_modifyitems(config, items):
    """Run the files that hold a `slow` test first (stable order otherwise). Under `make test` (pytest-xdist,
    `--dist loadfile --no-loadscope-reorder`) each worker takes whole files in collection order, so a long file
    collected last runs alone on one worker while the other idles; started first, the short files fill in beside
    it. (Without --no-loadscope-reorder xdist hands out the files with the most tests first, whatever this order.)"""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


def pytest_unconfigure(config):
    """Remove this run's compilation cache (only in the process that made it: the xdist controller, or the only
    process without xdist)."""
    if _OWN_CACHE is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
