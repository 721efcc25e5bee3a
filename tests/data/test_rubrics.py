"""Rubric checks by code, the rule judge, the LLM judge over a loopback OpenAI-compatible stub."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchjax.rewards.rubrics import (
    LLMJudge,
    OpenAIChatClient,
    Rubric,
    RuleJudge,
    check_format,
    detect_language,
    evaluate_rubrics,
    passes_all,
)
from searchjax.search import serving_in_background

PROMPT = "She will share u man power planning. We have to arrange lodging & boarding. Plz correct swntence."
# The write-up's five rubrics for this prompt (RECIPE.md §3.2), in its order.
EXAMPLE_RUBRICS = [
    Rubric("The response is written in English.", "language", {"lang": "en"}, priority=1),
    Rubric('The corrected sentence contains "lodging" and "boarding".', "contains",
           {"all": ["lodging", "boarding"]}, priority=2),
    Rubric('The corrected sentence uses "manpower" as one word, not "man power".', "one_word",
           {"word": "manpower", "split_forms": ["man power"]}, priority=0),
    Rubric('The corrected sentence contains neither "u" nor "Plz", and no "&".', "not_contains",
           {"any": ["u", "Plz", "&"]}, priority=0),
    Rubric("The response contains no citation markers of the form [type:idx].", "no_citations", {}, priority=1),
]
GOOD = "She will share the manpower planning with you. We have to arrange lodging and boarding."


def test_good_correction_passes_every_rubric():
    assert evaluate_rubrics(PROMPT, GOOD, EXAMPLE_RUBRICS, RuleJudge()) == [True] * 5
    assert passes_all(PROMPT, GOOD, EXAMPLE_RUBRICS, RuleJudge())


@pytest.mark.parametrize(
    "bad, failing",
    [
        ("Elle partagera le manpower planning avec vous. Nous devons organiser le lodging et le boarding.", 0),
        ("She will share the manpower planning with you. We have to arrange accommodation and meals.", 1),
        ("She will share the man power planning with you. We have to arrange lodging and boarding.", 2),
        ("She will share u the manpower planning. We have to arrange lodging and boarding.", 3),
        ("Plz note: she will share the manpower planning. We have to arrange lodging and boarding.", 3),
        ("She will share the manpower planning with you. We have to arrange lodging & boarding.", 3),
        ("She will share the manpower planning with you [web:2]. We have to arrange lodging and boarding.", 4),
    ],
)
def test_each_violation_fails_exactly_its_rubric(bad, failing):
    verdicts = evaluate_rubrics(PROMPT, bad, EXAMPLE_RUBRICS, RuleJudge())
    assert verdicts == [i != failing for i in range(5)], verdicts


def test_whole_word_matching_does_not_fire_inside_words():
    r = Rubric("no u", "not_contains", {"any": ["u"]})
    assert evaluate_rubrics("", "You use umbrellas.", [r], RuleJudge()) == [True]
    assert evaluate_rubrics("", "I will call u.", [r], RuleJudge()) == [False]


@pytest.mark.parametrize(
    "text, lang",
    [("The cat is on the table and it is happy.", "en"), ("Der Hund ist nicht mit dem Auto gekommen.", "de"),
     ("Nous avons une maison dans la ville.", "fr"), ("Vi har inte det som de har.", "sv"),
     ("我们需要安排住宿和餐饮。", "zh"), ("宿泊と食事を手配する必要があります。", "ja"), ("Мы должны организовать жильё.", "ru"),
     ("1234 !!", "und")],
)
def test_detect_language(text, lang):
    assert detect_language(text) == lang


def test_formats():
    assert check_format("- a\n- b\n- c", "list") and not check_format("a, b and c.", "list")
    assert check_format("| a | b |\n|---|---|\n| 1 | 2 |", "table") and not check_format("a | b", "table")
    assert check_format("The answer is Paris.", "one_sentence")
    assert not check_format("It is Paris. It is in France.", "one_sentence")
    length = Rubric("at most 5 words", "length", {"max_words": 5})
    assert evaluate_rubrics("", "one two three", [length], RuleJudge()) == [True]
    assert evaluate_rubrics("", "one two three four five six", [length], RuleJudge()) == [False]


def test_bad_rubrics_are_named():
    with pytest.raises(ValueError, match="unknown kind 'colour'"):
        Rubric("x", "colour")
    with pytest.raises(ValueError, match=r"missing param\(s\) \['all'\]"):
        Rubric("x", "contains", {})
    with pytest.raises(ValueError, match="no params\\['keywords'\\]"):
        RuleJudge()("p", "r", [Rubric("is helpful", "judge")])
    r = Rubric("covers the plan", "judge", {"keywords": ["plan"]}, priority=2)
    assert Rubric.from_dict(r.to_dict()) == r


class _StubHandler(BaseHTTPRequestHandler):
    """An OpenAI-compatible /chat/completions stub: verdict = the rubric text appears in the response."""

    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, self.headers.get("Authorization"), body))
        user = body["messages"][-1]["content"]
        response = user.split("RESPONSE:\n", 1)[1].split("\n\nRUBRICS:\n", 1)[0]
        rubric_lines = user.split("RUBRICS:\n", 1)[1].splitlines()
        verdicts = [line.split(". ", 1)[1].lower() in response.lower() for line in rubric_lines]
        content = "Sure.\n```json\n" + json.dumps({"verdicts": verdicts}) + "\n```"
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
    server.requests = []
    with serving_in_background(server):
        yield server


def test_llm_judge_over_openai_compatible_stub(stub_server):
    url = f"http://127.0.0.1:{stub_server.server_address[1]}/v1"
    judge = LLMJudge(OpenAIChatClient(url, "judge-model", api_key="k", timeout_s=5))
    rubrics = EXAMPLE_RUBRICS + [Rubric("share the planning", "judge"), Rubric("mentions a budget", "judge")]
    verdicts = evaluate_rubrics(PROMPT, "She will share the planning. " + GOOD, rubrics, judge)
    assert verdicts == [True] * 6 + [False]
    path, auth, body = stub_server.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k" and body["model"] == "judge-model"
    assert len(stub_server.requests) == 1  # code rubrics never reach the judge


def test_http_client_unreachable_endpoint_raises_clearly():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
    port = server.server_address[1]
    server.server_close()
    client = OpenAIChatClient(f"http://127.0.0.1:{port}", "m", timeout_s=1, retries=1)
    with pytest.raises(RuntimeError, match="no response after 2 attempts"):
        client([{"role": "user", "content": "hi"}])


def test_llm_judge_rejects_wrong_verdict_count():
    judge = LLMJudge(lambda messages: '{"verdicts": [true]}')
    with pytest.raises(ValueError, match="2 boolean verdicts"):
        judge("p", "r", [Rubric("a", "judge"), Rubric("b", "judge")])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_code_rubrics_never_raise_on_any_text(text):
    verdicts = evaluate_rubrics(PROMPT, text, EXAMPLE_RUBRICS, RuleJudge())
    assert len(verdicts) == 5 and all(isinstance(v, bool) for v in verdicts)
    assert detect_language(text) in {"und", "en", "de", "fr", "es", "it", "pt", "nl", "sv", "zh", "ja", "ko", "ru",
                                     "ar", "el", "he", "hi", "th"}
    for fmt in ("list", "table", "one_sentence"):
        assert isinstance(check_format(text, fmt), bool)


@pytest.mark.parametrize("text, has_marker", [
    ("See [web:3].", True), ("See [attached_file:12].", True), ("See [memory: 1].", True),
    ("See [web:1,3] and more.", True), ("See [chart:2, 4].", True),
    ("Paris[web:1] is the capital.", True),  # markers glued to a word count too
    ("A list [1, 2] and a time 10:30.", False), ("Ratio [a:b].", False), ("See [web:].", False),
])
def test_citation_markers(text, has_marker):
    r = Rubric("no citations", "no_citations", {})
    assert evaluate_rubrics("", text, [r], RuleJudge()) == [not has_marker]
