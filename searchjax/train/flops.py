"""Useful model FLOPs of a training or inference pass: the numerator of the MFU estimate."""

from __future__ import annotations

from searchjax.model import ModelConfig, param_count


def model_flops(cfg: ModelConfig, batch: int, seq: int, backward: bool = True) -> float:
    """FLOPs of a forward (2×) or forward+backward (6×) pass over [batch, seq] tokens.

        2·f · N_matmul · B·T  +  f · 4·B·T²·N·H · L_full / 2          (f = 3 with the backward, else 1)

    N_matmul = the matmul parameters one token uses (active parameters minus the embedding table, which is a
    gather); the second term is attention scores and values, halved for causality. The delta rule, norms and
    softmaxes are not counted (small beside the projections).
    """
    matmul_params = param_count(cfg, active=True) - cfg.vocab_size * cfg.hidden_size
    factor = 3 if backward else 1
    attn = factor * 4 * batch * seq**2 * cfg.num_attention_heads * cfg.head_dim * cfg.num_full_layers // 2
    return 2 * factor * matmul_params * batch * seq + attn
