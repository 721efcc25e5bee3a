"""searchjax.atomic: the old output survives any failure, the new one replaces it whole, no temp is left."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from searchjax.atomic import atomic_path, atomic_write_bytes, atomic_write_text


def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir())


def test_write_text_replaces_and_leaves_no_temp(tmp_path):
    out = tmp_path / "out.txt"
    atomic_write_text(out, "old\n")
    atomic_write_text(out, "new\n")
    assert out.read_text() == "new\n"
    assert _siblings(out) == ["out.txt"]


def test_failed_write_keeps_the_old_file(tmp_path):
    out = tmp_path / "out.txt"
    atomic_write_bytes(out, b"good")
    with pytest.raises(RuntimeError), atomic_path(out) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("writer died")
    assert out.read_bytes() == b"good"
    assert _siblings(out) == ["out.txt"]


def test_directory_is_replaced_whole(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "stale.json").write_text("{}")
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]
    assert _siblings(out) == ["model"]


def test_failed_directory_build_leaves_nothing(tmp_path):
    out = tmp_path / "index"
    with pytest.raises(ValueError), atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "half").write_text("x")
        raise ValueError("bad corpus line")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_file_never_replaces_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError), atomic_path(tmp_path / "d") as tmp:
        tmp.write_text("x")
    assert (tmp_path / "d").is_dir() and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_nothing_written_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing was written"), atomic_path(tmp_path / "x"):
        pass


def test_mode_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644


def test_sigterm_mid_write_keeps_the_previous_output(tmp_path):
    """A writer killed by SIGTERM through the CLI's handler (SIGTERM -> KeyboardInterrupt) leaves the old file."""
    out = tmp_path / "qa.jsonl"
    out.write_text("good\n" * 10)
    script = textwrap.dedent(f"""
        import os, signal, sys
        from searchjax.cli.main import install_signal_handlers
        from searchjax.atomic import atomic_path
        install_signal_handlers()
        try:
            with atomic_path({str(out)!r}) as tmp, open(tmp, "w") as f:
                for i in range(297):
                    f.write("partial\\n")
                f.flush()
                os.kill(os.getpid(), signal.SIGTERM)
                f.write("never\\n")
        except KeyboardInterrupt:
            sys.exit(130)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert out.read_text() == "good\n" * 10
    assert _siblings(out) == ["qa.jsonl"]
