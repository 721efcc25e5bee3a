"""The sweep: budget enforcement at every b (scripted model), and with the real engine the outputs, one compile
for two models of one architecture, same seed -> same results.jsonl, resume after an interruption."""

import dataclasses
import json

import jax
import pytest

from searchjax.config import ConfigError
from searchjax.eval.calls import CATEGORIES
from searchjax.eval.cost import load_prices
from searchjax.eval.dataset import EvalQuestion, load_questions
from searchjax.eval.graders import RuleGrader
from searchjax.eval.harness import EvalConfig, PolicyModel, _engine_for, load_policy, run_sweep, sweep_model
from searchjax.eval.results import ResultsFile
from searchjax.eval.summary import CSV_COLUMNS
from searchjax.search import TantivyBackend, budget_instruction

CALL = ("I should search.\n</think>\n\n<tool_call>\n<function=search_web>\n<parameter=query>\naccelerator launched"
        "\n</parameter>\n</function>\n</tool_call>")
BAD = "</think>\n\n<tool_call>\n<function=open_url>\n<parameter=url>\nx\n</parameter>\n</function>\n</tool_call>"
ANSWER = "Found it.\n</think>\n\nGrawiam Joraex<|im_end|>"
QUESTION = EvalQuestion("q1", "Name the founder of the accelerator launched in July 1990.", ("Grawiam Joraex",))


def _scripted_sweep(tokenizer, scripted_driver, world, script, budgets, tmp_path, question=QUESTION,
                    max_new_tokens=400):
    tmp_path.mkdir(exist_ok=True)
    driver = scripted_driver(tokenizer, script)
    model = PolicyModel("scripted", "-", None, None, tokenizer)
    cfg = EvalConfig(budgets=budgets, max_new_tokens=max_new_tokens)
    results = ResultsFile(tmp_path / "results.jsonl")
    rows = {}
    sweep_model(model, driver, [question], TantivyBackend(world / "index"), cfg, RuleGrader(), results, rows,
                progress=False)
    return {key[2]: row for key, row in rows.items()}, driver


def test_the_budget_is_stated_and_enforced_at_every_b(tokenizer, scripted_driver, world, tmp_path):
    rows, driver = _scripted_sweep(tokenizer, scripted_driver, world, [CALL], (0, 1, 2, 3), tmp_path)
    for b, prompt in zip((0, 1, 2, 3), driver.prompts):
        assert budget_instruction(b) in prompt
    for b, row in rows.items():
        # b searches run; the next call fails ("budget used up") and the one after ends the rollout
        assert (row["tool_calls"], row["failed_calls"], row["finish_reason"]) == (b + 2, 2, "budget"), (b, row)
        expected = {c: 0 for c in CATEGORIES}
        expected["at_zero_budget" if b == 0 else "over_budget"] = 2
        assert row["broken_calls"] == expected and row["search_errors"] == 0
    assert len(ResultsFile(tmp_path / "results.jsonl").load()) == 4


def test_budget_zero_offers_the_tool_but_any_call_is_broken(tokenizer, scripted_driver, world, tmp_path):
    rows, driver = _scripted_sweep(tokenizer, scripted_driver, world, [BAD, CALL, ANSWER], (0, 2), tmp_path)
    assert "search_web" in driver.prompts[0]  # the tool is still in the system turn
    zero, two = rows[0], rows[2]
    assert (zero["tool_calls"], zero["failed_calls"], zero["finish_reason"]) == (2, 2, "answer")
    assert zero["broken_calls"]["at_zero_budget"] == 2 and zero["answer"] == "Grawiam Joraex" and zero["correct"]
    assert (two["tool_calls"], two["failed_calls"]) == (2, 1)
    assert two["broken_calls"]["unknown_function"] == 1 and sum(two["broken_calls"].values()) == 1


def test_the_search_service_url_serves_the_same_results_as_the_index(tokenizer, scripted_driver, world, tmp_path):
    from searchjax.cli.eval import _backend
    from searchjax.search import HttpBackend, SearchHTTPServer, serving_in_background

    index = TantivyBackend(world / "index")
    with serving_in_background(SearchHTTPServer(index, port=0)) as server:
        backend = _backend(server.url)
        assert isinstance(backend, HttpBackend)
        driver = scripted_driver(tokenizer, [CALL, ANSWER])
        model = PolicyModel("scripted", "-", None, None, tokenizer)
        rows = {}
        sweep_model(model, driver, [QUESTION], backend, EvalConfig(budgets=(2,), max_new_tokens=400), RuleGrader(),
                    ResultsFile(tmp_path / "results.jsonl"), rows, progress=False)
    (via_url,) = rows.values()
    (via_dir,) = _scripted_sweep(tokenizer, scripted_driver, world, [CALL, ANSWER], (2,), tmp_path / "dir")[0].values()
    assert via_url == via_dir and via_url["tool_calls"] == 1 and via_url["failed_calls"] == 0


UNANSWERABLE = EvalQuestion("q-none", "Who founded the accelerator launched in July 1855?", (), answerable=False)


def test_abstention_is_an_answer_that_declines(tokenizer, scripted_driver, world, tmp_path):
    abstain = "Nothing found.\n</think>\n\nI could not find any reliable source about it.<|im_end|>"
    (row,) = _scripted_sweep(tokenizer, scripted_driver, world, [abstain], (1,), tmp_path, UNANSWERABLE)[0].values()
    assert (row["abstained"], row["correct"], row["grade"], row["answerable"]) == (True, True, "NOT_ATTEMPTED", False)
    (row,) = _scripted_sweep(tokenizer, scripted_driver, world, [ANSWER], (1,), tmp_path / "b", UNANSWERABLE)[0].values()
    assert (row["abstained"], row["correct"], row["grade"]) == (False, False, "INCORRECT")  # an invention
    (row,) = _scripted_sweep(tokenizer, scripted_driver, world, ["thinking on and on "], (1,), tmp_path / "c",
                             UNANSWERABLE, max_new_tokens=20)[0].values()
    assert row["finish_reason"] == "max_tokens" and row["answer"] == "" and not row["abstained"]
    assert not row["correct"] and row["grade"] == "NOT_ATTEMPTED"  # cut off: no answer, but no abstention either
    (row,) = _scripted_sweep(tokenizer, scripted_driver, world, ["Hm.\n</think>\n\n<|im_end|>"], (1,), tmp_path / "d",
                             UNANSWERABLE)[0].values()
    assert (row["finish_reason"], row["answer"], row["abstained"], row["grade"]) == ("answer", "", False, "NOT_ATTEMPTED")


# ------------------------------------------------------------------------------------------- the real engine
CFG = EvalConfig(budgets=(0, 1, 2), samples=2, max_new_tokens=10, slots=4, max_len=2048, max_prefill_length=1024,
                 temperature=0.6, seed=3)


@pytest.fixture(scope="module")
def setup(world, model_dir):
    questions = load_questions(world / "qa.jsonl")[:6]
    first = load_policy("random", model_dir)
    second = dataclasses.replace(first, label="other", params=jax.tree.map(lambda x: -x, first.params))
    engine = _engine_for(first, CFG, None)
    return questions, [first, second], engine, TantivyBackend(world / "index"), load_prices()


def _sweep(setup, out, grader=None, cfg=CFG):
    questions, models, engine, backend, prices = setup
    return run_sweep(models, questions, backend, cfg, out, grader=grader or RuleGrader(), prices=prices,
                     questions_source="qa.jsonl", engine=engine, progress=False)


@pytest.fixture(scope="module")
def first_run(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("first")
    return out, _sweep(setup, out)


@pytest.mark.slow
def test_the_sweep_writes_every_output(setup, first_run):
    questions, models, engine, _, _ = setup
    out, report = first_run
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    keys = [(r["model"], r["question_id"], r["budget"], r["sample"]) for r in rows]
    assert sorted(keys) == sorted((m.label, q.id, b, s) for m in models for q in questions for b in CFG.budgets
                                  for s in range(CFG.samples))
    for r in rows:
        assert r["tokens_out"] <= CFG.max_new_tokens and r["tokens_in"] > 0
        assert r["answerable"] == next(q.answerable for q in questions if q.id == r["question_id"])
    lines = (out / "summary.csv").read_text().splitlines()
    assert lines[0] == ",".join(CSV_COLUMNS) and len(lines) == 1 + len(models) * len(CFG.budgets)
    assert (out / "tool_efficiency.png").stat().st_size > 1000 and (out / "cost_accuracy.png").stat().st_size > 1000
    assert "## Broken tool calls" in (out / "summary.md").read_text()
    assert len(json.loads((out / "metrics.json").read_text())["internal"]) == 6
    assert report.stats["random"].trajectories == len(rows) // 2 and report.resumed == 0
    # Two models of one architecture: one engine, its decode step traced once.
    assert engine.trace_counts["generate"] == 1


@pytest.mark.slow
def test_the_same_seed_gives_the_same_results(setup, first_run, tmp_path):
    traces = dict(setup[2].trace_counts)
    _sweep(setup, tmp_path)
    assert (tmp_path / "results.jsonl").read_bytes() == (first_run[0] / "results.jsonl").read_bytes()
    assert setup[2].trace_counts == traces  # a second sweep of both models compiles nothing


class _Interrupting(RuleGrader):
    """Grades like RuleGrader, and interrupts the run (as a kill would) at the n-th answer."""

    def __init__(self, n):
        self.n = n

    def simpleqa(self, question, answer, aliases):
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt
        return super().simpleqa(question, answer, aliases)


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_results(setup, first_run, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _sweep(setup, tmp_path, grader=_Interrupting(10))
    done = (tmp_path / "results.jsonl").read_text().splitlines()
    assert 0 < len(done) < 10
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write('{"model": "random", "question_id": "torn')  # a kill in the middle of writing a line
    report = _sweep(setup, tmp_path)
    assert report.resumed == len(done)
    assert report.stats["random"].trajectories + report.stats["other"].trajectories == 72 - len(done)
    assert (tmp_path / "results.jsonl").read_bytes() == (first_run[0] / "results.jsonl").read_bytes()
    report = _sweep(setup, tmp_path)  # nothing left to do
    assert report.resumed == 72 and report.stats["random"].trajectories == 0


@pytest.mark.slow
def test_resuming_with_other_settings_is_refused(setup, first_run):
    with pytest.raises(ConfigError, match="other settings.*temperature"):
        _sweep(setup, first_run[0], cfg=dataclasses.replace(CFG, temperature=1.0))


@pytest.mark.slow
def test_a_bad_results_line_names_file_and_line(setup, tmp_path):
    (tmp_path / "results.jsonl").write_text('{"model": "random"}\n{}\n')
    with pytest.raises(ValueError, match=r"results.jsonl:1: missing key"):
        _sweep(setup, tmp_path)


def test_an_llm_grader_grades_on_worker_threads(tokenizer, scripted_driver, world, tmp_path):
    import threading

    from searchjax.eval.graders import LLMGrader

    threads = set()

    def judge(messages):
        threads.add(threading.get_ident())
        return '{"grade": "CORRECT"}' if "Grawiam Joraex" in messages[1]["content"].split("ANSWER:")[1] else \
            '{"grade": "INCORRECT"}'

    driver = scripted_driver(tokenizer, [ANSWER])
    model = PolicyModel("scripted", "-", None, None, tokenizer)
    cfg = EvalConfig(budgets=(0, 1, 2), samples=2, max_new_tokens=100, grader="llm", judge_url="http://unused",
                     grader_workers=3)
    rows = {}
    stats = sweep_model(model, driver, [QUESTION], TantivyBackend(world / "index"), cfg, LLMGrader(judge),
                        ResultsFile(tmp_path / "results.jsonl"), rows, progress=False)
    assert stats.trajectories == 6 and len(rows) == 6 and all(r["grade"] == "CORRECT" for r in rows.values())
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 6
    assert threading.get_ident() not in threads  # not graded in the driver's loop
