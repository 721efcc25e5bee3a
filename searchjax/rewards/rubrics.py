"""Rubrics for non-verifiable chat prompts (RECIPE.md §3.2) and the judges that check them.

A rubric is an atomic, objective, necessary check a response must pass. Its `priority` follows the write-up's
order: 0 = an explicit user requirement, 1 = an internal constraint, 2 = a content requirement implied by the
reference answer. r_base of a rubric prompt is 1 iff every rubric passes (RECIPE.md §4).

Kinds checked by code (deterministic, no model):
  language      the response is written in `params["lang"]` (ISO 639-1, identified by py3langid)
  contains      every phrase in `params["all"]` occurs (case-insensitive, whole words)
  not_contains  no phrase in `params["any"]` occurs (whole words for word-like phrases, plain substring for
                symbols such as "&"; `params["case_sensitive"]`, default false)
  one_word      `params["word"]` occurs and none of `params["split_forms"]` ("man power") does
  no_citations  no citation marker of the form [type:idx], e.g. "[web:3]"
  format        `params["format"]` in {"list", "table", "one_sentence"}
  length        word count within [`params.get("min_words", 0)`, `params.get("max_words", inf)`]
Everything else has kind "judge" and goes to a `Judge`: `RuleJudge` (the offline default: a content rubric
passes iff the response contains all of `params["keywords"]`) or `LLMJudge` over any chat client, e.g.
`OpenAIChatClient` for an OpenAI-compatible endpoint or a callable wrapping the project's own model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

CODE_KINDS = ("language", "contains", "not_contains", "one_word", "no_citations", "format", "length")
KINDS = CODE_KINDS + ("judge",)
FORMATS = ("list", "table", "one_sentence")
# [type:idx], also with several indices ("[web:1,3]", "[web:1, 3]") as engines emit them.
CITATION_RE = re.compile(r"\[[A-Za-z_][A-Za-z0-9_-]*:\s*\d+(?:\s*,\s*\d+)*\]")


class ChatClientError(RuntimeError):
    """An LLM endpoint gave no usable answer (unreachable, timed out, malformed response)."""


class ModelReplyError(ValueError):
    """A judge or rubric writer replied, but not in the JSON shape asked for."""


@dataclasses.dataclass(frozen=True)
class Rubric:
    """One atomic check. `params` holds the kind's arguments (see the module docstring)."""

    text: str
    kind: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    priority: int = 2

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"rubric {self.text!r}: unknown kind {self.kind!r}; expected one of {list(KINDS)}")
        if self.priority not in (0, 1, 2):
            raise ValueError(f"rubric {self.text!r}: priority must be 0, 1 or 2, got {self.priority!r}")
        _validate_params(self)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "kind": self.kind, "params": dict(self.params), "priority": self.priority}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rubric:
        unknown = sorted(set(d) - {"text", "kind", "params", "priority"})
        if unknown:
            raise ValueError(f"rubric: unknown key(s) {unknown}; valid keys are ['kind', 'params', 'priority', 'text']")
        if not isinstance(d.get("text"), str) or not isinstance(d.get("kind"), str):
            raise TypeError(f"rubric: 'text' and 'kind' must be strings, got {d.get('text')!r:.60} and "
                            f"{d.get('kind')!r:.40}")
        if not isinstance(d.get("params", {}), dict):
            raise TypeError(f"rubric {d['text']!r}: 'params' must be an object, got {type(d['params']).__name__}")
        priority = d.get("priority", 2)
        if isinstance(priority, bool):
            raise TypeError(f"rubric {d['text']!r}: priority must be 0, 1 or 2, got {priority!r}")
        return cls(text=d["text"], kind=d["kind"], params=dict(d.get("params", {})), priority=priority)


_REQUIRED_PARAMS = {
    "language": ("lang",), "contains": ("all",), "not_contains": ("any",), "one_word": ("word", "split_forms"),
    "no_citations": (), "format": ("format",), "length": (), "judge": (),
}


# Types of the params the code checks read ("phrases": a non-empty list of non-empty strings).
_PARAM_TYPES: dict[str, Any] = {
    "all": "phrases", "any": "phrases", "split_forms": "phrases", "keywords": "phrases", "word": str,
    "lang": str, "format": str, "min_words": int, "max_words": int,
}


def _validate_params(r: Rubric) -> None:
    missing = [p for p in _REQUIRED_PARAMS[r.kind] if p not in r.params]
    if missing:
        raise ValueError(f"rubric {r.text!r} (kind {r.kind}): missing param(s) {missing}")
    for name, value in r.params.items():
        expected = _PARAM_TYPES.get(name)
        if expected is None:
            continue
        ok = (isinstance(value, list) and bool(value) and all(isinstance(v, str) and v for v in value)
              if expected == "phrases" else isinstance(value, expected) and not isinstance(value, bool))
        if not ok:
            want = "a non-empty list of non-empty strings" if expected == "phrases" else expected.__name__
            raise ValueError(f"rubric {r.text!r} (kind {r.kind}): param {name!r} must be {want}, got {value!r:.80}")
    if r.kind == "format" and r.params["format"] not in FORMATS:
        raise ValueError(f"rubric {r.text!r}: format must be one of {list(FORMATS)}, got {r.params['format']!r}")
    if r.kind == "language" and r.params["lang"] not in LANGUAGES:
        raise ValueError(f"rubric {r.text!r}: lang must be one of {sorted(LANGUAGES)}, got {r.params['lang']!r}")


# ----------------------------------------------------------------------------------------------- language id
# The languages a rubric may name; the identifier chooses among these only.
LANGUAGES = frozenset({"en", "de", "fr", "es", "it", "pt", "nl", "sv", "zh", "ja", "ko", "ru", "ar", "el", "he", "hi",
                       "th"})
_WORD_RE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


@functools.lru_cache(maxsize=1)
def _identifier():
    """py3langid's naive-Bayes byte n-gram model (shipped with the package), restricted to LANGUAGES."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    identifier.set_languages(sorted(LANGUAGES))
    return identifier


def identify_language(text: str) -> tuple[str, float]:
    """(ISO 639-1 code, its posterior probability among LANGUAGES) of `text`; ("und", 0.0) when nothing decides.

    Nothing decides when the text has no letter, or none of its byte n-grams is in the model (a uniform
    posterior). Short text can be decided with low confidence: callers that need a firm decision (the eval's
    language-mismatch metric) threshold the probability.
    """
    if not any(c.isalpha() for c in text):
        return "und", 0.0
    language, probability = _identifier().classify(text)
    if probability <= 1.0 / len(LANGUAGES) + 1e-6:
        return "und", 0.0
    return language, probability


def detect_language(text: str) -> str:
    """ISO 639-1 code of `text` (one of LANGUAGES), or "und" when nothing decides (see `identify_language`)."""
    return identify_language(text)[0]


# ------------------------------------------------------------------------------------------ code-checked kinds
def _phrase_re(phrase: str, case_sensitive: bool) -> re.Pattern:
    """Whole-word match for word-like phrases; plain substring for phrases made of symbols ("&")."""
    flags = 0 if case_sensitive else re.IGNORECASE
    body = re.escape(phrase)
    if phrase[:1].isalnum():
        body = r"(?<![\w])" + body
    if phrase[-1:].isalnum():
        body = body + r"(?![\w])"
    return re.compile(body, flags)


def _has(text: str, phrase: str, case_sensitive: bool = False) -> bool:
    return _phrase_re(phrase, case_sensitive).search(text) is not None


_LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+\S")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)+\|?\s*$")
_SENTENCE_END = re.compile(r"[.!?。！？]+(?=\s|$)")


def check_format(text: str, fmt: str) -> bool:
    """list: ≥2 bullet/numbered lines; table: a markdown header separator row and ≥2 rows with pipes;
    one_sentence: a single line with exactly one sentence-ending punctuation run (at its end)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if fmt == "list":
        return sum(bool(_LIST_LINE.match(ln)) for ln in lines) >= 2
    if fmt == "table":
        return any(_TABLE_SEP.match(ln) for ln in lines) and sum("|" in ln for ln in lines) >= 3
    if fmt == "one_sentence":
        body = text.strip()
        ends = _SENTENCE_END.findall(body)
        return len(lines) == 1 and len(ends) == 1 and _SENTENCE_END.search(body).end() == len(body)
    raise ValueError(f"unknown format {fmt!r}; expected one of {list(FORMATS)}")


def check_code_rubric(rubric: Rubric, response: str) -> bool:
    """Evaluate a code-checkable rubric on `response` (raises ValueError for kind "judge")."""
    p, kind = rubric.params, rubric.kind
    case = bool(p.get("case_sensitive", False))
    if kind == "language":
        return detect_language(response) == p["lang"]
    if kind == "contains":
        return all(_has(response, w, case) for w in p["all"])
    if kind == "not_contains":
        return not any(_has(response, w, case) for w in p["any"])
    if kind == "one_word":
        return _has(response, p["word"], case) and not any(_has(response, s, case) for s in p["split_forms"])
    if kind == "no_citations":
        return CITATION_RE.search(response) is None
    if kind == "format":
        return check_format(response, p["format"])
    if kind == "length":
        n = len(_WORD_RE.findall(response))
        return p.get("min_words", 0) <= n <= p.get("max_words", float("inf"))
    raise ValueError(f"rubric {rubric.text!r}: kind {kind!r} is not checkable by code; use a Judge")


# ----------------------------------------------------------------------------------------------------- judges
class Judge(Protocol):
    """Decides judge-kind rubrics: one bool per rubric, in order."""

    def __call__(self, prompt: str, response: str, rubrics: Sequence[Rubric]) -> list[bool]: ...


class RuleJudge:
    """Offline deterministic judge: a judge rubric passes iff the response contains all of its `keywords`.

    The template rubric generator attaches the keywords (the reference answer's content words) to every content
    rubric; a rubric without keywords cannot be decided by rules and raises, naming it.
    """

    def __call__(self, prompt: str, response: str, rubrics: Sequence[Rubric]) -> list[bool]:
        out = []
        for r in rubrics:
            keywords = r.params.get("keywords")
            if not keywords:
                raise ValueError(f"RuleJudge: rubric {r.text!r} has no params['keywords']; use an LLMJudge for it")
            out.append(all(_has(response, k) for k in keywords))
        return out


ChatClient = Callable[[list[dict[str, str]]], str]
JUDGE_SYSTEM = (
    "You are a strict grader. For each numbered rubric decide whether the RESPONSE satisfies it, judging only "
    'what the rubric states. Reply with JSON only: {"verdicts": [true or false, one per rubric, in order]}.'
)


def extract_json(text: str) -> Any:
    """The first JSON object in `text` (models often wrap it in prose or ``` fences)."""
    start = text.find("{")
    while start != -1:
        try:
            return json.JSONDecoder().raw_decode(text, start)[0]
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
    raise ModelReplyError(f"no JSON object in model output {text[:200]!r}")


class LLMJudge:
    """Judge served by any chat client (`messages -> text`): the project's own model or an HTTP endpoint."""

    def __init__(self, client: ChatClient):
        self.client = client

    def __call__(self, prompt: str, response: str, rubrics: Sequence[Rubric]) -> list[bool]:
        listing = "\n".join(f"{i + 1}. {r.text}" for i, r in enumerate(rubrics))
        user = f"PROMPT:\n{prompt}\n\nRESPONSE:\n{response}\n\nRUBRICS:\n{listing}"
        reply = self.client([{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}])
        parsed = extract_json(reply)
        verdicts = parsed.get("verdicts") if isinstance(parsed, dict) else None
        if not isinstance(verdicts, list) or len(verdicts) != len(rubrics) or not all(
            isinstance(v, bool) for v in verdicts
        ):
            raise ModelReplyError(f"judge reply must hold {len(rubrics)} boolean verdicts, got {verdicts!r}")
        return verdicts


class OpenAIChatClient:
    """Minimal client for an OpenAI-compatible `POST {base_url}/chat/completions` (stdlib only).

    Timeouts and connection errors are retried `retries` times with a short back-off; then `ChatClientError` (a
    RuntimeError) names the endpoint and the last error. Temperature 0 by default so judging is as repeatable
    as the server allows.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 retries: int = 2, temperature: float = 0.0, max_tokens: int = 1024):
        if not base_url.startswith(("http://", "https://")):
            raise ChatClientError(f"endpoint URL must start with http:// or https://, got {base_url!r}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key, self.timeout_s, self.retries = model, api_key, timeout_s, retries
        self.temperature, self.max_tokens = temperature, max_tokens

    def __call__(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    payload = json.loads(resp.read())
                return payload["choices"][0]["message"]["content"]
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = e
                time.sleep(0.05 * (attempt + 1))
            except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
                raise ChatClientError(f"{self.url}: malformed chat completion response ({e!r})") from None
        raise ChatClientError(f"{self.url}: no response after {self.retries + 1} attempts ({last!r})")


def evaluate_rubrics(prompt: str, response: str, rubrics: Sequence[Rubric], judge: Judge) -> list[bool]:
    """One verdict per rubric, in order: code kinds by code, the judge kinds in one call to `judge`."""
    verdicts: list[bool | None] = [None] * len(rubrics)
    judged = []
    for i, r in enumerate(rubrics):
        if r.kind == "judge":
            judged.append(i)
        else:
            verdicts[i] = check_code_rubric(r, response)
    if judged:
        for i, v in zip(judged, judge(prompt, response, [rubrics[i] for i in judged])):
            verdicts[i] = bool(v)
    return [bool(v) for v in verdicts]


def passes_all(prompt: str, response: str, rubrics: Sequence[Rubric], judge: Judge) -> bool:
    """r_base of a rubric prompt (RECIPE.md §4): 1 iff every rubric is satisfied."""
    return all(evaluate_rubrics(prompt, response, rubrics, judge))
