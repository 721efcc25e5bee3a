"""searchjax.config: YAML -> frozen dataclasses with clear errors."""

import dataclasses
from typing import Literal, Optional

import pytest

from searchjax.config import ConfigError, from_dict, load_yaml, to_dict


@dataclasses.dataclass(frozen=True)
class Inner:
    width: int
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    layers: tuple[str, ...] = ()
    mode: Literal["a", "b"] = "a"
    cap: Optional[float] = None


def test_round_trip():
    cfg = from_dict(Outer, {"name": "x", "inner": {"width": 3, "scale": 2}, "layers": ["p", "q"], "cap": 1})
    assert cfg == Outer("x", Inner(3, 2.0), ("p", "q"), "a", 1.0)
    assert from_dict(Outer, to_dict(cfg)) == cfg


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, {"name": "x", "inner": {"width": 3, "wdith": 4}})
    msg = str(e.value)
    assert "Outer.inner" in msg and "'wdith'" in msg and "['scale', 'width']" in msg


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"name": 1, "inner": {"width": 3}}, "Outer.name: expected str"),
        ({"name": "x", "inner": {"width": 3.5}}, "Outer.inner.width: expected int"),
        ({"name": "x", "inner": {"width": True}}, "Outer.inner.width: expected int"),
        ({"name": "x", "inner": {"width": 3}, "mode": "c"}, "expected one of ['a', 'b']"),
        ({"name": "x", "inner": {"width": 3}, "cap": "big"}, "Outer.cap"),
        ({"name": "x"}, "missing required key(s) ['inner']"),
    ],
)
def test_type_errors_name_the_field(data, fragment):
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, data)
    assert fragment in str(e.value)


def test_load_yaml_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\ninner: {width: 2}\nbogus: 1\n")
    with pytest.raises(ConfigError, match=str(p)):
        load_yaml(Outer, p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_yaml(Outer, p)
    with pytest.raises(ConfigError, match="no such config file"):
        load_yaml(Outer, tmp_path / "missing.yaml")


@dataclasses.dataclass(frozen=True)
class Checked:
    lo: int
    hi: int

    def __post_init__(self):
        if self.lo > self.hi:
            raise ValueError(f"lo must be <= hi, got {self.lo} > {self.hi}")


def test_post_init_errors_name_the_file(tmp_path):
    p = tmp_path / "checked.yaml"
    p.write_text("lo: 3\nhi: 1\n")
    with pytest.raises(ConfigError, match=rf"{p}: lo must be <= hi, got 3 > 1"):
        load_yaml(Checked, p)
