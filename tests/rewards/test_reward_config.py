"""RewardConfig: YAML loading, validation, hashability (static under jit)."""

import pytest

from searchjax.config import ConfigError, from_dict, load_yaml
from searchjax.rewards import RewardConfig


def test_from_dict_overrides_and_rejects_unknown_keys():
    cfg = from_dict(RewardConfig, {"alpha_win": 2, "is_cap": 2.0, "aggregation": "linear"})
    assert cfg.alpha_win == 2.0 and cfg.is_cap == 2.0 and cfg.aggregation == "linear"
    hash(cfg)
    with pytest.raises(ConfigError, match="valid keys"):
        from_dict(RewardConfig, {"alpha_winner": 1.0})
    with pytest.raises(ConfigError, match="aggregation"):
        from_dict(RewardConfig, {"aggregation": "sum"})


@pytest.mark.parametrize("bad", [{"beta_lose": -0.1}, {"is_cap": 0.0}, {"preferred_threshold": 1.5}, {"clip_eps": 1.0},
                                 {"sequence_is": True, "clip_eps": 0.2}, {"answer_f1_threshold": 0.0},
                                 {"norm_length": 0}, {"sequence_is": True, "norm_length": 64}])
def test_invalid_values_raise_naming_the_field(bad, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join(f"{k}: {str(v).lower()}" for k, v in bad.items()))
    with pytest.raises(ConfigError, match=str(path)):
        load_yaml(RewardConfig, path)
    with pytest.raises(TypeError, match="RewardConfig"):
        RewardConfig(**bad)
