"""searchjax.cli.common: one-line errors with status 1, port and count checks, output and input checks."""

import argparse

import pytest

from searchjax.cli.common import (CLIError, check_input_dir, check_input_file, check_output, check_port,
                                  int_at_least, run_command)
from searchjax.config import ConfigError
from searchjax.data.jsonl import DataError
from searchjax.search.types import SearchError


@pytest.mark.parametrize("exc", [CLIError("bad\nthing"), ConfigError("bad thing"), DataError("bad thing"),
                                 SearchError("bad thing"), ValueError("bad thing"),
                                 FileNotFoundError(2, "No such file or directory", "bad thing")])
def test_run_command_prints_one_line_and_returns_1(exc, capsys):
    def command(args):
        raise exc

    assert run_command(command)(argparse.Namespace()) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "bad" in err and "Traceback" not in err


def test_run_command_interrupt_is_130(capsys):
    def command(args):
        raise KeyboardInterrupt

    assert run_command(command)(argparse.Namespace()) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_run_command_keeps_bugs_loud():
    def command(args):
        raise KeyError("a bug, not an input error")

    with pytest.raises(KeyError):
        run_command(command)(argparse.Namespace())


@pytest.mark.parametrize("text", ["-1", "65536", "99999", "http"])
def test_check_port_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="0..65535"):
        check_port(text)


def test_check_port_accepts():
    assert check_port("0") == 0 and check_port("65535") == 65535


def test_int_at_least():
    assert int_at_least(1)("3") == 3
    for bad in ("0", "-1", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            int_at_least(1)(bad)


def test_check_output(tmp_path):
    assert check_output(tmp_path / "x.jsonl", overwrite=False) == tmp_path / "x.jsonl"
    with pytest.raises(CLIError, match="does not exist"):
        check_output(tmp_path / "r" / "x.jsonl", overwrite=False)
    with pytest.raises(CLIError, match="is a directory"):
        check_output(tmp_path, overwrite=True)
    (tmp_path / "f").write_text("")
    with pytest.raises(CLIError, match="--overwrite"):
        check_output(tmp_path / "f", overwrite=False)
    assert check_output(tmp_path / "f", overwrite=True)
    with pytest.raises(CLIError, match="is a file"):
        check_output(tmp_path / "f", overwrite=True, kind="dir")
    (tmp_path / "d").mkdir()
    with pytest.raises(CLIError, match="--overwrite"):
        check_output(tmp_path / "d", overwrite=False, kind="dir")
    assert check_output(tmp_path / "d", overwrite=True, kind="dir")


def test_check_inputs(tmp_path):
    with pytest.raises(CLIError, match="--prompts .*no such file"):
        check_input_file(tmp_path / "nope", "--prompts")
    with pytest.raises(CLIError, match="is a directory"):
        check_input_file(tmp_path, "--prompts")
    with pytest.raises(CLIError, match="no such directory"):
        check_input_dir(tmp_path / "nope", "--model")
    with pytest.raises(CLIError, match="missing config.json"):
        check_input_dir(tmp_path, "--model", needs=("config.json",))
