"""searchjax: a JAX reference implementation of search-agent post-training (SFT + GRPO) on Qwen3.5 MoE."""

__version__ = "0.1.0"
