"""Test-wide JAX set-up: CPU only, 8 fake devices for sharding tests (set before JAX initialises)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()


import gc  # noqa: E402

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
