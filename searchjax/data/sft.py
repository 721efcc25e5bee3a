"""SFT warm-up data (RECIPE.md §1): production-format tool-use trajectories and preference-style examples.

Record schema (one JSONL object):
  id        str
  kind      "sft"
  category  "single_turn" | "two_turn" | "multi_turn" (tool-use trajectories), or "abstention", or a
            preference-style category from the rubric data ("correct", "rewrite", "plan", "format", "translate",
            "same_language")
  messages  OpenAI-style conversation: a system turn (search_web budget), user turns, assistant turns with
            `reasoning_content` and `tool_calls` [{type: "function", function: {name: "search_web",
            arguments: {query}}}], tool turns with the search_web response text; the last turn is an assistant
            answer. Rendered by `searchjax.chat`; the loss mask covers assistant tokens only.
  sources   ids of the QA / rubric records the example was made from
  split     "train" | "dev"

Trajectories come from running the search-only solver as the expert over verified synthetic QA: each search is
one assistant tool call and one tool response; the final answer follows the question's format instruction when
it has one (formatting on request). Two-turn conversations add a follow-up about the answer entity that the
expert answers with one more search (checked against the KB); multi-turn ones add a formatting request over
both answers. Abstention examples ask about an entity that does not exist: the expert searches, finds no result
that mentions it, and says so. Tone, clarity and language consistency come from the rubric prompts' references.

Recovery (`SFTBuilder(recovery=p)`: a share p of the trajectories): one tool call is first made malformed, as a
small policy breaks it, and answered with the agent's error response; the expert's own call follows as the
correction. The malformed turn has ``weight`` 0 (context, not a target: no loss), so the policy learns to correct
a rejected call, never to make one. Without it a policy that breaks a call has never seen the error response and
repeats the broken call (`with_recovery`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from searchjax.chat.parser import parse_assistant, rejection_response
from searchjax.chat.template import last_query_index
from searchjax.data.jsonl import require
from searchjax.data.prompts import system_message
from searchjax.data.questions import PIN_RELATIONS, Step, describe, mentions, parse_question
from searchjax.data.solvers import SearchSolver, SearchTrace, parse_results
from searchjax.data.synth import FORMAT_INSTRUCTIONS
from searchjax.search import SEARCH_WEB_TOOL, SearchBackend, SearchTool
from searchjax.search.tool import MAX_RESULTS
from searchjax.search.world import KnowledgeBase

TRAJECTORY_CATEGORIES = ("single_turn", "two_turn", "multi_turn")
THOUGHT_STYLES = ("rewrite", "found", "plain")


def tool_call_turn(thought: str, query: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "reasoning_content": thought,
            "tool_calls": [{"type": "function", "function": {"name": "search_web", "arguments": {"query": query}}}]}


def searched_turns(trace: SearchTrace) -> list[dict[str, Any]]:
    """One assistant tool call + one tool response per search the expert made."""
    turns = []
    for thought, query, response in trace.calls:
        turns += [tool_call_turn(thought, query), {"role": "tool", "content": response}]
    return turns


CALL_CLOSING_TAGS = "\n</parameter>\n</function>\n</tool_call>"


def malformed_call(thought: str, rng: random.Random) -> str:
    """A tool-calling turn broken the way small policies break it: the first words of the thought (at least two)
    run straight into a call's closing tags, with no ``</think>`` and no call opened. 29 of the 34 rejected turns
    of session 24's 750-step SFT policy on held-out questions (RESULTS.md) were of this kind."""
    words = thought.split()
    return " ".join(words[: rng.randint(min(2, len(words)), len(words))]) + CALL_CLOSING_TAGS


def with_recovery(messages: Sequence[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]] | None:
    """`messages` with one rejected call before a random tool-calling turn after the last user query: the turn
    broken by `malformed_call` (``weight`` 0), the agent's response to it (the parser's errors through
    `rejection_response`), then the original turn, now the correction. None when no turn after the last user
    query calls a tool (earlier turns render without their thinking, where the break happens)."""
    turns = [i for i, m in enumerate(messages) if i > last_query_index(messages) and m.get("tool_calls")]
    if not turns:
        return None
    i = rng.choice(turns)
    text = malformed_call(messages[i].get("reasoning_content") or "", rng)
    parsed = parse_assistant(text, [SEARCH_WEB_TOOL], thinking=True)
    if parsed.tool_calls or not parsed.errors:
        raise AssertionError(f"malformed_call gave a turn the parser accepts: {text!r}")
    broken = {"role": "assistant", "content": "", "reasoning_content": text, "weight": 0}
    return [*messages[:i], broken, {"role": "tool", "content": rejection_response(parsed.errors)}, *messages[i:]]


def format_answer(answer: str, found: Sequence[str], fmt: str | None) -> str:
    """The final answer, in the format the question asked for (plain sentence by default)."""
    if fmt == "list":
        return "\n".join(f"- {name}" for name in found[:-1]) + f"\n- **{answer}** (the answer)"
    if fmt == "table":
        rows = "\n".join(f"| {i + 1} | {name} |" for i, name in enumerate(found))
        return f"| step | entity |\n|---|---|\n{rows}"
    return f"The answer is {answer}."


def question_format(question: str) -> str | None:
    """Which format instruction (if any) the question ends with."""
    for fmt, instruction in FORMAT_INSTRUCTIONS:
        if question.endswith(instruction):
            return fmt
    return None


def without_format(question: str) -> str:
    """The question without the format instruction it ends with (if any)."""
    fmt = question_format(question)
    return question[: -len(dict(FORMAT_INSTRUCTIONS)[fmt]) - 1] if fmt else question


def _final_turn(trace: SearchTrace, fmt: str | None) -> dict[str, Any]:
    chain = " → ".join(trace.found)
    return {"role": "assistant", "reasoning_content": f"The searches give the chain {chain}.",
            "content": format_answer(trace.answer, trace.found, fmt)}


def nested_descriptions(question: str) -> list[str] | None:
    """The descriptions nested in a generated question, innermost first, as its text spells them.

    "What is the event where the founder of the organisation founded in 2008 spoke?" gives ["the organisation
    founded in 2008", "the founder of the organisation founded in 2008", "the event where the founder of …
    spoke"]: description k names the entity of the question's k-th hop. None when the question has not exactly
    one reading or a description does not occur in it.
    """
    readings = parse_question(question)
    if len(readings) != 1:
        return None
    out: list[str] = []
    for step in readings[0]:
        out.append(describe(step.relation, step.unknown, out[-1] if out else step.value, step.cohort))
    folded = question.casefold()
    return out if all(d.casefold() in folded for d in out) else None


def substitute(question: str, description: str, name: str) -> str:
    """`question` with the first occurrence of `description` (any case) replaced by `name`."""
    at = question.casefold().index(description.casefold())
    return question[:at] + name + question[at + len(description):]


def rewrite_thoughts(question: str, trace: SearchTrace, *, found: bool = False) -> tuple[list[str], str] | None:
    """Thoughts that carry the question forward by substitution (the `rewrite` style of `SFTBuilder`).

    After hop k found the entity n_k, the question with its k-th nested description replaced by n_k is what is
    left to answer, and the next search is the innermost description of that question:

        hop 1:  "I need the organisation founded in 2008, so I will search for it."
        hop 2:  "The question is now: What is the event where the founder of Kystou Systems spoke? I need the
                 founder of Kystou Systems, so I will search for it."
        final:  "The question is now: What is Rostem Northern Symposium? So the answer is Rostem Northern
                 Symposium."

    The state of a multi-hop search is then written out in every turn (which hop comes next, and when none is
    left), instead of being kept implicitly across turns. With `found` (the `found` style), each turn after a
    search first states what that search found, as the name read from its results and the description it
    searched for, before the question left:

        hop 2:  "Kystou Systems is the organisation founded in 2008. The question is now: What is the event where
                 the founder of Kystou Systems spoke? I need the founder of Kystou Systems, so I will search for it."
        final:  "Rostem Northern Symposium is the event where Krawov Fuvawiath spoke. The question is now: …"

    so the substitution copies the name from the same thought instead of from the results. The name comes first:
    with "<description> is <name>." a wrong name that shares tokens with the description's own entity ("… hosted
    Baepy Glass Fair is Gapy Glass Fair") was continued by copying what followed it there (" is Gapy Glass Fair is
    …") until max_tokens (RESULTS.md "SFT warm-up", session 23). Returns (one thought per search, the final
    thought), or None when the question's descriptions cannot be found in its text (`nested_descriptions`).
    """
    descs = nested_descriptions(without_format(question))
    if descs is None or len(descs) != len(trace.found) or len(trace.calls) != len(trace.found):
        return None
    rewritten = [substitute(question, d, name) for d, name in zip(descs, trace.found)]
    stated = [""] * len(descs)
    if found:  # hop k searched for its description with hop k-1's entity in place of the nested one
        searched = [descs[0]] + [substitute(d, inner, name) for d, inner, name in zip(descs[1:], descs, trace.found)]
        stated = [f"{name} is {d}. " for d, name in zip(searched, trace.found)]
    thoughts = [trace.calls[0][0]] + [f"{said}The question is now: {q} {thought}"
                                      for said, q, (thought, _, _) in zip(stated, rewritten, trace.calls[1:])]
    return thoughts, f"{stated[-1]}The question is now: {rewritten[-1]} So the answer is {trace.answer}."


class SFTBuilder:
    """Runs the search-only expert over QA records and writes SFT examples (see the module docstring)."""

    def __init__(self, kb: KnowledgeBase, backend: SearchBackend, *, tool_budget: int = 5, seed: int = 0,
                 max_results: int = MAX_RESULTS, thoughts: str = "plain", recovery: float = 0.0):
        if thoughts not in THOUGHT_STYLES:
            raise ValueError(f"thoughts must be one of {list(THOUGHT_STYLES)}, got {thoughts!r}")
        if not 0.0 <= recovery <= 1.0:
            raise ValueError(f"recovery must be a share of the trajectories in [0, 1], got {recovery!r}")
        self.recovery = recovery
        self.recovery_rng = random.Random(f"recovery-{seed}")  # its own stream: recovery=0 changes no example
        self.kb, self.backend, self.tool_budget, self.max_results = kb, backend, tool_budget, max_results
        self.thoughts = thoughts
        self.expert = SearchSolver(backend, max_calls=tool_budget, max_results=max_results)
        self.rng = random.Random(seed)
        self.summary: Counter = Counter()

    def _solve(self, record: dict[str, Any]) -> SearchTrace | None:
        trace = self.expert.solve(without_format(record["question"]))
        if trace.answer is None or trace.answer.casefold() != record["answer"].casefold():
            self.summary["rejected:expert_failed"] += 1
            return None
        return trace

    def _follow_up(self, record: dict[str, Any]) -> tuple[str, list[dict[str, Any]], str, str] | None:
        """A question about a literal fact of the answer entity, answered with one search (KB-checked)."""
        rels = [r for r in self.kb.relations_from(record["seed"]) if r.relation in PIN_RELATIONS]
        if not rels:
            return None
        rel = self.rng.choice(rels)
        name = record["answer"]
        question = f"What is {describe(rel.relation, 'o', name)}?"
        trace = SearchTrace(found=[name])
        tool = SearchTool(self.backend, self.tool_budget, self.max_results)
        value = self.expert._step(tool, Step(rel.relation, "o"), name, trace)
        if value != rel.value:
            return None
        phrase = describe(rel.relation, "o", name)
        return question, searched_turns(trace), value, f"{phrase[0].upper()}{phrase[1:]} is {value}."

    def solved(self, record: dict[str, Any]) -> tuple[list[dict[str, Any]], SearchTrace] | None:
        """The single-question conversation of one verified QA record and the expert's trace (None if it fails)."""
        trace = self._solve(record)
        if trace is None:
            return None
        messages = [system_message(self.tool_budget), {"role": "user", "content": record["question"]},
                    *searched_turns(trace), _final_turn(trace, question_format(record["question"]))]
        if self.thoughts != "plain":
            rewrite = rewrite_thoughts(record["question"], trace, found=self.thoughts == "found")
            if rewrite is None:
                self.summary["rejected:no_rewrite"] += 1
                return None
            calls, final = rewrite
            for turn, thought in zip(messages[2::2], calls):
                turn["reasoning_content"] = thought
            messages[-1]["reasoning_content"] = final
        return messages, trace

    def trajectory(self, record: dict[str, Any], category: str) -> dict[str, Any] | None:
        """A single-, two- or multi-turn tool-use example for one verified QA record (None when it fails)."""
        solved = self.solved(record)
        if solved is None:
            return None
        messages, trace = solved
        if category != "single_turn":
            follow = self._follow_up(record)
            if follow is None:
                self.summary["rejected:no_follow_up"] += 1
                return None
            question, turns, value, answer = follow
            messages += [{"role": "user", "content": question}, *turns, {"role": "assistant", "content": answer}]
            if category == "multi_turn":
                table = f"| question | answer |\n|---|---|\n| 1 | {trace.answer} |\n| 2 | {value} |"
                messages += [{"role": "user", "content": "Put both answers in a table."},
                             {"role": "assistant", "content": table}]
        if self.recovery and self.recovery_rng.random() < self.recovery:
            recovered = with_recovery(messages, self.recovery_rng)
            if recovered is not None:
                messages = recovered
                self.summary["with_recovery"] += 1
        return {"id": f"sft-{category}-{record['id']}", "kind": "sft", "category": category,
                "messages": messages, "sources": [record["id"]], "split": record["split"]}

    def abstention(self, index: int, split: str = "train") -> dict[str, Any] | None:
        """A question about an entity that does not exist; the expert searches and declines to guess."""
        name = _fake_name(self.rng)
        if self.kb.by_name(name):
            return None
        relation = self.rng.choice(("founded_year", "born_year", "published_year", "population"))
        phrase = describe(relation, "o", name)
        tool = SearchTool(self.backend, self.tool_budget, self.max_results)
        query = phrase.removeprefix("the ")
        result = tool.call({"query": query})
        if any(mentions(snippet + " " + title, name) for title, _, snippet in parse_results(result.text)):
            return None
        messages = [system_message(self.tool_budget), {"role": "user", "content": f"What is {phrase}?"},
                    tool_call_turn(f"I need {phrase}, so I will search for it.", query),
                    {"role": "tool", "content": result.text},
                    {"role": "assistant", "reasoning_content": f"No result mentions {name}.",
                     "content": f"I searched for {name} but found no reliable source that mentions it, so I "
                                f"cannot tell you {phrase}."}]
        return {"id": f"sft-abstention-{index:06d}", "kind": "sft", "category": "abstention",
                "messages": messages, "sources": [], "split": split}

    def build(self, qa_records: Sequence[dict[str, Any]], rubric_records: Sequence[dict[str, Any]] = (),
              n_abstention: int = 0) -> Iterator[dict[str, Any]]:
        """Trajectories over `qa_records` (categories cycle), abstentions, and rubric-reference examples."""
        for i, record in enumerate(qa_records):
            example = self.trajectory(record, TRAJECTORY_CATEGORIES[i % 3])
            if example is not None:
                self.summary[f"kept:{example['category']}"] += 1
                yield example
        made = attempts = 0
        while made < n_abstention and attempts < 20 * n_abstention:
            attempts += 1
            example = self.abstention(made)
            if example is not None:
                made += 1
                self.summary["kept:abstention"] += 1
                yield example
        for r in rubric_records:
            example = preference_example(r, self.tool_budget)
            self.summary[f"kept:{example['category']}"] += 1
            yield example


def preference_example(rubric_record: dict[str, Any], tool_budget: int) -> dict[str, Any]:
    """A preference-style SFT example: the rubric prompt answered by its reference (tone, language, format)."""
    messages = [system_message(tool_budget), *rubric_record["messages"],
                {"role": "assistant", "content": rubric_record["reference"]}]
    # category and split are optional in a rubric row (validate_rubric_record): default to the generic ones.
    return {"id": f"sft-{rubric_record['id']}", "kind": "sft", "category": rubric_record.get("category", "rubric"),
            "messages": messages, "sources": [rubric_record["id"]], "split": rubric_record.get("split", "train")}


_SYLLABLES = ("zor", "vel", "quin", "brax", "tul", "mey", "dro", "fen", "kas", "lor", "nix", "pav", "ryo", "sem")


def _fake_name(rng: random.Random) -> str:
    word = lambda: "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()  # noqa: E731
    return f"{word()} {word()}"


def validate_sft_record(row: dict[str, Any]) -> None:
    """Schema check of one SFT row."""
    for field, kind in (("id", str), ("category", str), ("messages", list), ("sources", list), ("split", str)):
        require(row, field, kind)
    for i, m in enumerate(row["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TypeError(f"field 'messages'[{i}]: expected an object with a string 'role', got {m!r:.80}")
    if not row["messages"] or row["messages"][-1]["role"] != "assistant":
        raise ValueError("field 'messages': the last turn must be an assistant answer")
