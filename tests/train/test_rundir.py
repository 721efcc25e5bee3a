"""The resume rule of searchjax.train.rundir: same config resumes, a computing key refuses, a display key does not."""

import dataclasses

import pytest

from searchjax.config import ConfigError
from searchjax.train.rundir import DISPLAY_ONLY, prepare_run_dir


@dataclasses.dataclass(frozen=True)
class _Cfg:
    seed: int = 0
    progress: bool = True


def test_resume_ignores_display_keys_and_refuses_the_rest(tmp_path):
    out = tmp_path / "run"
    assert not prepare_run_dir(out, "sft", _Cfg()).resuming
    assert prepare_run_dir(out, "sft", _Cfg()).resuming
    assert "progress" in DISPLAY_ONLY
    assert prepare_run_dir(out, "sft", _Cfg(progress=False)).resuming
    with pytest.raises(ConfigError, match=r"differs .*\['seed'\]"):
        prepare_run_dir(out, "sft", _Cfg(seed=1, progress=False))
