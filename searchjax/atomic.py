"""Atomic outputs: write into a temporary sibling, then rename it over the target on success.

A reader of `path` sees the old output or the new one, never a partial write: a crash, an exception or a
SIGTERM (which the CLI turns into an exception) leaves the previous `path` intact and removes the temporary
sibling. Files are created with plain `open`, so their mode follows the user's umask. Data is fsynced before
the rename and the parent directory after it, so a power cut cannot leave a renamed but empty file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


def temp_sibling(path: str | os.PathLike, tag: str = "tmp") -> Path:
    """A fresh hidden name beside `path` (same directory, hence same filesystem: rename is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


def replaceable_dir(path: str | os.PathLike, marker: str) -> bool:
    """Whether a library writer may replace `path` whole: it is absent, an empty directory, or a directory
    holding `marker` (the file that writer leaves, e.g. world.json), never an unrelated folder or a file."""
    path = Path(path)
    if not path.exists():
        return True
    return path.is_dir() and ((path / marker).exists() or not any(path.iterdir()))


def remove_path(path: Path) -> None:
    """Remove a file, a link or a directory tree; nothing if absent."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _fsync(path: Path) -> None:
    """fsync a file, or every file and directory of a tree (a directory's entries are data too)."""
    if path.is_dir():
        for root, _dirs, files in os.walk(path):
            for name in files:
                _fsync_one(Path(root) / name, os.O_RDONLY)
            _fsync_one(Path(root), os.O_RDONLY | os.O_DIRECTORY)
    elif path.exists():
        _fsync_one(path, os.O_RDONLY)


def _fsync_one(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _install(tmp: Path, path: Path) -> None:
    """Rename `tmp` over `path`, replacing whatever is there whole (a directory cannot be renamed over a
    non-empty one, so an old directory is first moved aside and removed after the switch). A file never
    replaces a directory, nor a directory a file: that is a wrong path, not an update."""
    if path.exists() and path.is_dir() != tmp.is_dir():
        kind = "directory" if path.is_dir() else "file"
        raise (IsADirectoryError if path.is_dir() else NotADirectoryError)(
            f"{path} is a {kind}; refusing to replace it with a {'file' if kind == 'directory' else 'directory'}")
    if path.is_dir() and not path.is_symlink():
        old = temp_sibling(path, "old")
        os.replace(path, old)
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old, path)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    with contextlib.suppress(OSError):  # some filesystems cannot fsync a directory; the rename still happened
        _fsync_one(path.parent if str(path.parent) else Path("."), os.O_RDONLY | os.O_DIRECTORY)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write (a file, or a directory the caller creates); on a normal
    exit it replaces `path` whole, on any exception (KeyboardInterrupt and SystemExit included) it is removed
    and `path` is left as it was."""
    path = Path(path)
    tmp = temp_sibling(path)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"{path}: nothing was written (no {tmp.name})")
        _fsync(tmp)
        _install(tmp, path)
    finally:
        remove_path(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
