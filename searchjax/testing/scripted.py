"""`ScriptedDriver`: a stand-in for `RolloutDriver` that plays given assistant texts with the real tokenizer.

The agent loop, the chat template, the tool-call parser, the search tool and the records stay real; only the
tokens come from a script instead of a model. It stops like the real driver: at a stop id, else at the request's
max_new_tokens, else when prompt + generation reach the cache (max_len); a text without a stop id repeats, as a
model that never stops. Its log μ is one constant per token (0 by default: a script is deterministic). It keeps the
decoded prompt of every rollout's first turn in `prompts`, for tests of what the model was shown.
"""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from searchjax.rollout.driver import Completion


class ScriptedDriver:
    """Plays `script(rollout, turn)` (the request's tag, i.e. the agent's rollout state, and its 0-based turn)."""

    def __init__(self, tokenizer, script: Callable[[Any, int], str], max_len: int = 4096, logprob: float = 0.0):
        self.tokenizer, self.script, self.logprob = tokenizer, script, logprob
        self.engine = types.SimpleNamespace(max_len=max_len)
        self.params, self.version = None, 0
        self.prompts: list[str] = []

    @classmethod
    def by_turn(cls, tokenizer, texts: Sequence[str], max_len: int = 4096, logprob: float = 0.0) -> ScriptedDriver:
        """Plays texts[turn] in every rollout, the last text at every later turn."""
        if isinstance(texts, str) or not texts:
            raise ValueError(f"ScriptedDriver.by_turn takes a non-empty sequence of texts, got {texts!r}")
        texts = tuple(texts)
        return cls(tokenizer, lambda rollout, turn: texts[min(turn, len(texts) - 1)], max_len, logprob)

    def set_params(self, params) -> None:
        self.params, self.version = params, self.version + 1

    def complete(self, request) -> Completion:
        """The completion of one request (module docstring)."""
        if request.tag.turns == 0:
            self.prompts.append(self.tokenizer.decode(request.prompt))
        text = self.tokenizer.encode(self.script(request.tag, request.tag.turns))
        if not text:
            raise ValueError(f"ScriptedDriver: the script gave no text for turn {request.tag.turns}")
        ids, reason, stop = [], None, None
        for t in itertools.cycle(text):
            ids.append(t)
            if t in request.stop_token_ids:
                reason, stop = "stop_token", t
            elif len(ids) >= request.max_new_tokens:
                reason = "max_tokens"
            elif len(request.prompt) + len(ids) >= self.engine.max_len:
                reason = "context"
            if reason:
                return Completion(request, np.asarray(ids, np.int32), np.full(len(ids), self.logprob, np.float32),
                                  reason, stop, 0.0, 0.0)

    def run(self, requests, on_finish=None) -> list[Completion]:
        """Complete every request and the follow-ups `on_finish` returns, in order."""
        pending, done = list(requests), []
        while pending:
            c = self.complete(pending.pop(0))
            done.append(c)
            pending += list(on_finish(c) or ()) if on_finish else []
        return done
