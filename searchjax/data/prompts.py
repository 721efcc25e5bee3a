"""The one prompt format every RL and SFT example shares: a system prompt with the search_web budget, then the
user turn(s). Verifiable QA (synthetic or public) and rubric chat differ only in where their user turns come from.
"""

from __future__ import annotations

from typing import Any

from searchjax.chat.template import TOOLS_HEADER, TOOLS_INSTRUCTIONS, tojson
from searchjax.search import SEARCH_WEB_TOOL, budget_instruction

SYSTEM_PROMPT = (
    "You are a search assistant. Use the search_web tool to find and check facts before you answer; answer "
    "in the language of the user, follow any format the user asks for, and say so plainly when the search "
    "finds no reliable evidence."
)


def system_message(tool_budget: int) -> dict[str, str]:
    """The system turn: the assistant's role and the hard cap on search_web calls (RECIPE.md §5)."""
    return {"role": "system", "content": f"{SYSTEM_PROMPT} {budget_instruction(tool_budget)}"}


def prompt_messages(record: dict[str, Any], tool_budget: int) -> list[dict[str, str]]:
    """System turn + the record's user side: `messages` for rubric records, `question` for QA records."""
    if "messages" in record:
        turns = [dict(m) for m in record["messages"] if m.get("role") != "system"]
    else:
        turns = [{"role": "user", "content": record["question"]}]
    return [system_message(tool_budget), *turns]


def prompt_phrases() -> list[str]:
    """The constant pieces of every prompt's rendered system turn, for `train_tokenizer(phrases=...)`.

    The chat template's tool block for [search_web] (header, the tool's JSON, the call-format instructions),
    `SYSTEM_PROMPT`, the budget sentence around its number, and the budget-0 sentence. The budget itself stays
    ordinary text ("5 times"), so the policy still reads it.
    """
    tools_block = TOOLS_HEADER + "\n" + tojson(SEARCH_WEB_TOOL) + TOOLS_INSTRUCTIONS
    head, tail = budget_instruction(7).split("7 times")
    return [tools_block, SYSTEM_PROMPT, head.rstrip(), tail, budget_instruction(0)]
