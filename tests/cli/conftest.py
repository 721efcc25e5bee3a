"""Helpers for CLI tests: run `searchjax` in-process and check the one-line error contract."""

from __future__ import annotations

import pytest

from searchjax.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(status, stdout, stderr) of `searchjax ARGV`, run in this process (argparse's exit gives its status)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def cli(capsys):
    """cli(*argv) -> (status, stdout, stderr)."""
    return lambda *argv: run_cli(capsys, *argv)


@pytest.fixture
def fails(cli):
    """fails(match, *argv): the command exits 1 with exactly one stderr line `error: ...` containing `match`;
    with alone=False, that line is the last one and may follow a summary or warnings."""

    def check(match: str, *argv: str, alone: bool = True) -> str:
        code, _, err = cli(*argv)
        assert code == 1, (argv, code, err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("error: ") and "Traceback" not in err, err
        assert sum(line.startswith("error: ") for line in lines) == 1 and (len(lines) == 1 or not alone), err
        assert match in lines[-1], (match, err)
        return lines[-1]

    return check


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny-preset checkpoint with vocab 300 (no tokenizer), written by `searchjax model init`."""
    out = tmp_path_factory.mktemp("tiny") / "model"
    assert main(["model", "init", "--preset", "tiny", "--vocab-size", "300", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def small_world(tmp_path_factory):
    """A small fictional world (no real-facts part) with its index at WORLD/index."""
    from searchjax.search import build_index, build_world

    world = tmp_path_factory.mktemp("world") / "w"
    build_world(world, seed=1, n_docs=600, include_real=False, progress=False)
    build_index(world / "corpus.jsonl", world / "index", progress=False)
    return world
