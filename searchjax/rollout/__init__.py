"""Rollouts: the Qwen3.5 model behind JetStream's Engine API, the RL rollout driver and the search agent.

    from searchjax.rollout import SearchJaxEngine, RolloutDriver, Request, Completion, Sampling, \
        AgentConfig, PromptItem, SearchAgent, run_rollouts, RolloutRecord, write_jsonl, read_jsonl, to_arrays, \
        group_records

- `SearchJaxEngine` (a jetstream.engine.engine_api.Engine): prefill / insert / generate over slots, sampling with
  temperature, top-p and top-k, log μ_infer of every sampled token; `prefill_slots` (`SlotPrefill`) prefills
  several requests at once into their slots, afresh or appended to a slot's cache.
- `RolloutDriver`: continuous batching for RL: tokens, log-probs, finish reasons, per-request stops, params swap
  (`version`), and multi-turn cache extension (a follow-up appends only its new tokens to its slot).
- the search agent (`run_rollouts`): multi-turn search_web rollouts → `RolloutRecord`s (JSONL, padded arrays,
  `group_records` for the [N, G] GRPO layout).
- `searchjax.rollout.serve.RolloutServer`: JetStream's orchestrator and Decode gRPC service with our engine, bound
  to 127.0.0.1 by default (`searchjax serve`); `searchjax.rollout.jetstream_compat` is the one JetStream bridge.
"""

from searchjax.rollout.agent import AgentConfig, PromptItem, SearchAgent, run_rollouts
from searchjax.rollout.driver import Completion, DriverStats, Request, RolloutDriver
from searchjax.rollout.engine import (
    DecodeState, JetStreamTokenizer, Prefix, SampledTokens, SearchJaxEngine, SlotPrefill,
)
from searchjax.rollout.records import (
    RecordGroups, RolloutRecord, group_records, read_jsonl, record_from_dict, to_arrays, write_jsonl,
)
from searchjax.rollout.sampling import Sampling, SamplingArrays, sample, sampling_logprobs, token_logprobs

__all__ = [
    "AgentConfig",
    "PromptItem",
    "RecordGroups",
    "RolloutRecord",
    "SearchAgent",
    "group_records",
    "read_jsonl",
    "record_from_dict",
    "run_rollouts",
    "to_arrays",
    "write_jsonl",
    "Completion",
    "DecodeState",
    "DriverStats",
    "JetStreamTokenizer",
    "Prefix",
    "Request",
    "RolloutDriver",
    "SampledTokens",
    "Sampling",
    "SamplingArrays",
    "SearchJaxEngine",
    "SlotPrefill",
    "sample",
    "sampling_logprobs",
    "token_logprobs",
]
