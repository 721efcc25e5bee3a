"""The multi-turn search agent: prompt → generate → search_web → … → final answer, one `RolloutRecord` each.

A turn generates until `</tool_call>`, `<|im_end|>` or `<|endoftext|>`. A stop at `</tool_call>` is exact: the
call is parsed (searchjax.chat.parse_assistant), executed by the rollout's `SearchTool` (which enforces the call
budget and counts c_i, e_i), and the harness appends, with loss mask 0, the end of the assistant turn
(`<|im_end|>\\n`), the tool response turn and the next generation prompt, all rendered by searchjax.chat's
template and encoded on their own: the sampled ids are never re-tokenised (token-in/token-out). A turn that
ends otherwise than on `<|im_end|>` (at `</tool_call>`, or a malformed call ending on `<|endoftext|>`) gets
`<|im_end|>` appended before the tool response.

Malformed calls (parser errors, an unknown function) are not executed; they count as a call and a failure,
get an error response and consume none of the budget b: that counts only the well-formed calls, and it is
checked before a call executes (`SearchAgent._execute`). Every rollout ends with a complete record:

    answer      a turn ended without a tool call (its content is the answer)
    max_tokens  the rollout's policy-token budget (max_new_tokens over all turns) is spent
    context     the sequence filled the engine's cache, or the next tool response would leave no room to
                generate (it is then not appended): a record never has more than max_len tokens
    budget      a well-formed call came after the model was told that its call budget was used up

Budgets are per prompt (`PromptItem.budget`, default `AgentConfig.budget`); b = 0 offers the tool but every
call fails without a search (tool_choice=none).

Groups (RECIPE.md §2): G rollouts per prompt with independent keys fold_in(fold_in(key, p), i), and optionally
one reference-model rollout per prompt (group_index −1, key fold_in(fold_in(key, p), G)) through the same driver
with the reference params swapped in (RECIPE.md §4: the preference score and L^ref).

Each turn's request is the whole sequence so far; the driver continues it in the slot of the previous turn,
prefilling only the tool response and the generation prompt (RolloutDriver's cache extension).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from searchjax.chat import encode_conversation, parse_assistant, render_segments
from searchjax.chat.parser import rejection_response
from searchjax.chat.template import IM_END, render_content
from searchjax.data.prompts import prompt_messages
from searchjax.rollout.driver import Completion, Request, RolloutDriver
from searchjax.rollout.records import POLICY, REFERENCE, RolloutRecord
from searchjax.rollout.sampling import Sampling
from searchjax.search import MAX_RESULTS, SEARCH_WEB_TOOL, TOOL_NAME, SearchBackend, SearchTool

TOOLS = (SEARCH_WEB_TOOL,)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """budget: search_web calls per rollout (b) of prompts without their own; max_new_tokens: policy tokens per
    rollout over all turns."""

    budget: int = 5
    max_new_tokens: int = 1024
    sampling: Sampling = Sampling()
    enable_thinking: bool = True
    max_results: int = MAX_RESULTS  # results a search shows (≤ 10); as many as the policy's SFT data showed

    def __post_init__(self):
        if self.budget < 0 or self.max_new_tokens < 1 or not 1 <= self.max_results <= MAX_RESULTS:
            raise ValueError(f"AgentConfig: budget >= 0, max_new_tokens >= 1 and 1 <= max_results <= "
                             f"{MAX_RESULTS} required, got {self}")


@dataclasses.dataclass(frozen=True)
class PromptItem:
    """A prompt to roll out: its id, its messages (system + user turns, OpenAI style) and its call budget.

    budget: the search_web calls this prompt's rollouts may execute (b); None means AgentConfig.budget. One
    driver run may mix budgets (the budget-forced sweep b = 0..10 in one batch). The system prompt states the
    budget only if the messages say so: `from_record` writes b into the system turn and sets the same b here.
    Records are keyed by prompt_id (and carry their budget), so a sweep gives each (question, budget) its own
    prompt_id.
    """

    prompt_id: str
    messages: tuple[Mapping[str, Any], ...]
    budget: int | None = None

    def __post_init__(self):
        b = self.budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
            raise ValueError(f"PromptItem {self.prompt_id!r}: budget must be None or an int >= 0, got {b!r}")

    @property
    def question(self) -> str:
        """The text of the last user turn (the question of a QA prompt), '' when there is none."""
        users = [m for m in self.messages if m.get("role") == "user"]
        return render_content(users[-1].get("content"), f"{self.prompt_id}: user turn") if users else ""

    @classmethod
    def from_record(cls, record: Mapping[str, Any], budget: int) -> "PromptItem":
        """From a QA record ({id, question, ...}) or a rubric record ({id, messages, ...}) of the data issue.

        The system turn states the cap of `budget` calls and the item enforces that same cap.
        """
        return cls(str(record["id"]), tuple(prompt_messages(dict(record), budget)), budget)


class _Rollout:
    """The growing state of one rollout, and its record once it is finished."""

    def __init__(self, item: PromptItem, group_index: int, model: str, key, prompt: list[int], tool: SearchTool,
                 sampling: Sampling, version: int):
        self.item, self.group_index, self.model, self.key, self.tool = item, group_index, model, key, tool
        self.sampling, self.version = sampling, version
        self.tokens, self.mask, self.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
        self.prompt_length, self.rejected, self.turns = len(prompt), 0, 0
        self.transcript: list[dict[str, Any]] = []
        self.routes: np.ndarray | None = None  # the last turn's Completion.routes (routing replay)
        self.timings = {"decode_s": 0.0, "queued_s": 0.0, "tool_s": 0.0}
        self.t0 = time.perf_counter()
        self.record: RolloutRecord | None = None

    def __repr__(self) -> str:
        return f"rollout({self.item.prompt_id!r}, group_index={self.group_index}, {self.model})"

    @property
    def calls(self) -> int:
        return self.tool.calls + self.rejected

    def add(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        """Append policy ids (with their log μ) or, with logprobs None, harness ids (mask 0)."""
        self.tokens += [int(i) for i in ids]
        self.mask += [0 if logprobs is None else 1] * len(ids)
        self.logprobs += [0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs]

    def cut(self, max_len: int) -> None:
        """Keep the first max_len tokens (a prompt that alone fills the cache; it has no policy token)."""
        self.tokens, self.mask, self.logprobs = self.tokens[:max_len], self.mask[:max_len], self.logprobs[:max_len]
        self.prompt_length = min(self.prompt_length, max_len)

    def finish(self, reason: str, answer: str) -> RolloutRecord:
        self.timings.update(turns=float(self.turns), wall_s=time.perf_counter() - self.t0)
        self.record = RolloutRecord(
            prompt_id=self.item.prompt_id, group_index=self.group_index, tokens=self.tokens, loss_mask=self.mask,
            logprobs=self.logprobs, prompt_length=self.prompt_length, tool_calls=self.calls,
            tool_failures=self.tool.failures + self.rejected, response_length=sum(self.mask), answer=answer,
            finish_reason=reason, model=self.model, timings=dict(self.timings), budget=self.tool.max_calls,
            policy_version=self.version, temperature=self.sampling.temperature, top_p=self.sampling.top_p,
            top_k=self.sampling.top_k, key_impl=str(jax.random.key_impl(self.key)),
            key_data=np.asarray(jax.random.key_data(self.key)).tolist(), question=self.item.question,
            turns=self.transcript, routes=self._routes(),
        )
        return self.record

    def _routes(self) -> np.ndarray | None:
        """The last turn's routes over every token (−1 on the harness tokens appended after it)."""
        if self.routes is None:
            return None
        r, n = self.routes[: len(self.tokens)], len(self.tokens)
        return np.concatenate([r, np.full((n - len(r), *r.shape[1:]), -1, r.dtype)]) if len(r) < n else r


class SearchAgent:
    """Runs rollouts of the search agent through a `RolloutDriver` (see module docstring)."""

    def __init__(self, driver: RolloutDriver, backend: SearchBackend, config: AgentConfig):
        self.driver, self.backend, self.config = driver, backend, config
        self.tokenizer = driver.tokenizer
        special = self.tokenizer.special
        self.stop_ids = (special.tool_call_end, special.im_end, special.endoftext)
        self.tool_call_end, self.im_end = special.tool_call_end, special.im_end

    def budget(self, item: PromptItem) -> int:
        """The call budget of `item`'s rollouts: its own, else AgentConfig.budget."""
        return self.config.budget if item.budget is None else item.budget

    def prompt_ids(self, item: PromptItem) -> list[int]:
        """The rendered prompt (tools in the system turn, generation prompt at the end) as ids."""
        ids, _ = encode_conversation(
            list(item.messages), self.tokenizer, tools=list(TOOLS), add_generation_prompt=True,
            enable_thinking=self.config.enable_thinking,
        )
        return ids.tolist()

    def tool_turn_ids(self, responses: Sequence[str], close_turn: bool) -> list[int]:
        """Ids the harness appends after a tool-calling turn: end of turn, tool response(s), generation prompt.

        close_turn: the generation did not end with `<|im_end|>` (it stopped at `</tool_call>` or on
        `<|endoftext|>`), so `<|im_end|>` is added first and the context stays on the chat template.
        """
        msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]
        msgs += [{"role": "tool", "content": text} for text in responses]
        segments = render_segments(msgs, add_generation_prompt=True, enable_thinking=self.config.enable_thinking)
        body = max(i for i, s in enumerate(segments) if s.trainable)
        # segments[body] ends in <|im_end|>, segments[body + 1] is the newline after it.
        tail = "".join(s.text for s in segments[body + 1 :])
        return self.tokenizer.encode((IM_END if close_turn else "") + tail)

    def _request(self, r: _Rollout) -> Request:
        remaining = self.config.max_new_tokens - sum(r.mask)
        return Request(
            prompt=tuple(r.tokens), max_new_tokens=remaining, key=jax.random.fold_in(r.key, r.turns),
            sampling=self.config.sampling, stop_token_ids=self.stop_ids, tag=r,
        )

    def _execute(self, r: _Rollout, parsed, log: list[dict[str, Any]]) -> tuple[list[str], bool]:
        """Run the turn's tool calls in order: (the responses, whether the rollout ends on "budget").

        A parser-rejected call is not executed, counts as a call and a failure, gets an error response and
        consumes no budget. A well-formed call goes to the rollout's SearchTool, which checks the budget before
        searching from its own count n of well-formed calls: calls n = 1..b search; a call with n > b runs no
        search and fails with a "budget used up" response. A well-formed call made after such a response was
        shown (n > b before this turn) also counts as a failed call, and the rollout ends on "budget".
        Each call is appended to `log` as {name, arguments, ok, error} for the record's transcript.
        """
        t0 = time.perf_counter()
        responses, told = [], r.tool.calls > r.tool.max_calls

        def reject(name: str, arguments: dict, errors: list[str]) -> None:
            r.rejected += 1
            responses.append(rejection_response(errors))
            log.append({"name": name, "arguments": arguments, "ok": False, "error": "malformed: " + "; ".join(errors)})

        calls = parsed.tool_calls
        if not calls:  # a stray </tool_call>: a malformed call
            reject("", {}, parsed.errors or ["no <tool_call> block"])
        ends = False
        for call in calls:
            if call.ok and call.name == TOOL_NAME:
                result = r.tool.call(dict(call.arguments))
                responses.append(result.text)
                log.append({"name": call.name, "arguments": dict(call.arguments), "ok": result.ok,
                            "error": result.error})
                ends = ends or told
            else:
                reject(call.name, dict(call.arguments), call.errors or [f"unknown tool {call.name!r}"])
        r.timings["tool_s"] += time.perf_counter() - t0
        return responses, ends

    def on_turn(self, c: Completion) -> list[Request]:
        """Consume one finished turn; return the next turn's request, or [] when the rollout is complete."""
        r: _Rollout = c.request.tag
        r.add(c.tokens, c.logprobs)
        r.routes = c.routes
        r.turns += 1
        r.timings["decode_s"] += c.decode_s
        r.timings["queued_s"] += c.queued_s
        text = self.tokenizer.decode(c.tokens)
        parsed = parse_assistant(text, list(TOOLS), thinking=self.config.enable_thinking)
        turn: dict[str, Any] = {"text": text, "tool_calls": []}
        r.transcript.append(turn)
        if c.finish_reason in ("context", "max_tokens"):
            r.finish(c.finish_reason, parsed.content)
            return []
        called = c.stop == self.tool_call_end or bool(parsed.tool_calls)
        if not called:
            r.finish("answer", parsed.content)
            return []
        responses, over_budget = self._execute(r, parsed, turn["tool_calls"])
        if over_budget:
            r.finish("budget", parsed.content)
            return []
        harness = self.tool_turn_ids(responses, close_turn=int(c.tokens[-1]) != self.im_end)
        if len(r.tokens) + len(harness) >= self.driver.engine.max_len:
            # No room to generate after the tool response: end here, so the record fits the cache (max_len).
            r.finish("context", parsed.content)
            return []
        r.add(harness, None)
        if sum(r.mask) >= self.config.max_new_tokens:
            r.finish("max_tokens", parsed.content)
            return []
        return [self._request(r)]

    def rollouts(
        self, items: Sequence[PromptItem], group_size: int, key: jax.Array, model: str = POLICY,
        on_record: Callable[[RolloutRecord], None] | None = None, *,
        item_keys: Sequence[jax.Array] | None = None, paired: bool = False,
    ) -> list[RolloutRecord]:
        """Roll out every item `group_size` times (policy) or once (reference, group_index −1).

        paired=True (reference only): `group_size` reference rollouts per item with group_index 0..G−1, each
        paired by index with the policy rollout of the same index (the GRPO stage's s = P̄(x, y_i, y_ref,i)).
        item_keys: one base key per item instead of fold_in(key, p), e.g. a key derived from the prompt id so a
        prompt's rollouts do not depend on its position in the batch (the GRPO reference cache).
        """
        if paired and model == POLICY:
            raise ValueError("rollouts: paired=True is for reference rollouts (model=REFERENCE)")
        if item_keys is not None and len(item_keys) != len(items):
            raise ValueError(f"rollouts: {len(item_keys)} item_keys for {len(items)} items")
        states = []
        version = self.driver.version if model == POLICY else -1
        for p, item in enumerate(items):
            prompt = self.prompt_ids(item)
            base = jax.random.fold_in(key, p) if item_keys is None else item_keys[p]
            indices = range(group_size) if model == POLICY or paired else [-1]
            for i in indices:
                k = jax.random.fold_in(base, group_size if i < 0 else i)
                tool = SearchTool(self.backend, self.budget(item), self.config.max_results)
                states.append(_Rollout(item, i, model, k, prompt, tool, self.config.sampling, version))

        def on_finish(c: Completion) -> list[Request]:
            follow = self.on_turn(c)
            if not follow and on_record is not None:
                on_record(c.request.tag.record)
            return follow

        runnable = []
        for r in states:
            if len(r.tokens) >= self.driver.engine.max_len:
                # The prompt alone fills the cache: a complete (empty) record, not an error that ends the batch,
                # cut to max_len like every record.
                r.cut(self.driver.engine.max_len)
                r.finish("context", "")
                if on_record is not None:
                    on_record(r.record)
            else:
                runnable.append(r)
        self.driver.run([self._request(r) for r in runnable], on_finish=on_finish)
        return [r.record for r in states]


def run_rollouts(
    agent: SearchAgent, items: Sequence[PromptItem], group_size: int, key: jax.Array,
    reference_params: Any = None, on_record: Callable[[RolloutRecord], None] | None = None,
) -> list[RolloutRecord]:
    """G policy rollouts per prompt, then (with reference_params) one reference rollout per prompt.

    The reference rollouts run through the same driver with the reference weights swapped in (no recompile);
    the policy weights and the driver's policy version are restored afterwards. Policy records carry the
    driver's `version` (bumped by every `set_params`), reference records policy_version −1.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    records = agent.rollouts(items, group_size, key, POLICY, on_record)
    if reference_params is not None:
        policy, version = agent.driver.params, agent.driver.version
        agent.driver.set_params(reference_params)
        try:
            records += agent.rollouts(items, group_size, key, REFERENCE, on_record)
        finally:
            agent.driver.params, agent.driver.version = policy, version
    return records
