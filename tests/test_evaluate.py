"""pass@k against brute force and closed forms; the harness end to end with a scripted engine."""

import dataclasses
import itertools
import json
import types
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from dynamo_jax import evaluate as ev
from dynamo_jax.config import EvalConfig
from dynamo_jax.data import DataConfig, Row, SyntheticScorer
from dynamo_jax.rewards import RewardConfig, RewardPool
from dynamo_jax.rollout.protocol import Completion, RolloutEngine, SamplingParams


def brute_force_pass_at_k(n, c, k):
    """Share of all k-subsets of the n samples (c of them correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return Fraction(sum(any(s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_brute_force_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert ev.pass_at_k(n, c, k) == pytest.approx(
                float(brute_force_pass_at_k(n, c, k)), abs=1e-12
            )


@pytest.mark.parametrize("n", [1, 5, 32, 200, 1024])
def test_pass_at_k_closed_forms_on_edge_cases(n):
    for k in {1, min(8, n), n}:
        assert ev.pass_at_k(n, 0, k) == 0.0  # c = 0
        assert ev.pass_at_k(n, n, k) == 1.0  # c = n
    for c in {1, n // 2, n - 1} - {0}:
        assert ev.pass_at_k(n, c, n) == 1.0  # k = n: every sample drawn
        assert ev.pass_at_k(n, c, 1) == pytest.approx(c / n, rel=1e-12)  # k = 1: accuracy


def test_pass_at_k_is_stable_where_binomials_are_huge():
    n, c, k = 1024, 3, 32  # C(1024, 32) ~ 1e61: the product form never forms it
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert ev.pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        ev.pass_at_k(n, c, k)


class ScriptedEngine:
    """Returns scripted response texts per prompt id, as byte tokens (decode = bytes.decode)."""

    def __init__(self, script: dict[int, list[str]], shuffle=False):
        self.script = script
        self.calls = []
        self.shuffle = shuffle
        self.closed = False

    def generate(self, requests, sampling):
        self.calls.append([(r.prompt_id, r.n) for r in requests])
        out = []
        for request in requests:
            texts = self.script[request.prompt_id]
            for i in range(request.n):
                ids = np.frombuffer(texts[i % len(texts)].encode(), np.uint8).astype(np.int32)
                out.append(
                    Completion(request.prompt_id, i, ids, np.zeros(len(ids), np.float32), "stop", 0)
                )
        return out[::-1] if self.shuffle else out

    def update_weights(self, params, version):
        pass

    @property
    def weight_version(self):
        return 0

    def close(self):
        self.closed = True


def decode(ids):
    return bytes(np.asarray(ids, np.uint8)).decode()


def _row(pid, gold, source):
    return Row(pid, pid, ({"role": "user", "content": f"q{pid}"},), gold, source)


ROWS = [_row(1, "2", "alpha"), _row(2, "3", "alpha"), _row(3, "4", "beta")]
PROMPTS = [(5, 6, 7)] * 3
SCRIPT = {
    1: ["2", "1", "2", "0"],  # 2 of 4 correct
    2: ["1", "x", "1", "1"],  # none correct, one without an answer
    3: ["4", "44", "4", "4"],  # 3 of 4 correct (44 is not 4)
}
SAMPLING = SamplingParams(max_new_tokens=4)


def _run(engine, **kwargs):
    kwargs = {"n_samples": 4, "ks": (1, 2, 8), **kwargs}
    return ev.evaluate(
        engine, ROWS, PROMPTS, scorer=SyntheticScorer(), decode=decode, sampling=SAMPLING, **kwargs
    )


def test_harness_reports_per_benchmark_and_overall():
    assert isinstance(ScriptedEngine(SCRIPT), RolloutEngine)
    report = _run(ScriptedEngine(SCRIPT))
    assert report.ks == (1, 2)  # 8 > n_samples is not reported
    alpha, beta, overall = (report.groups[g] for g in ("alpha", "beta", "overall"))
    assert list(report.groups) == ["alpha", "beta", "overall"]
    # pass@2 = 1 - C(n-c, 2) / C(4, 2): c=2 → 5/6, c=0 → 0, c=3 → 1
    assert alpha.pass_at[1] == pytest.approx((0.5 + 0.0) / 2)
    assert alpha.pass_at[2] == pytest.approx((5 / 6 + 0.0) / 2)
    assert beta.pass_at == pytest.approx({1: 0.75, 2: 1.0})
    assert overall.pass_at == pytest.approx({1: (0.5 + 0 + 0.75) / 3, 2: (5 / 6 + 0 + 1) / 3})
    assert alpha.no_answer_share == pytest.approx(
        1 / 8
    ) and overall.no_answer_share == pytest.approx(1 / 12)
    assert beta.mean_response_tokens == pytest.approx(5 / 4)  # "44" is 2 byte tokens
    assert overall.mean_response_tokens == pytest.approx(13 / 12)
    assert overall.status_shares["correct"] == pytest.approx(5 / 12)
    assert [p.num_correct for p in report.problems] == [2, 0, 3]


def test_chunking_does_not_change_the_report():
    engine = ScriptedEngine(SCRIPT)
    chunked = _run(engine, chunk_prompts=2)
    assert engine.calls == [[(1, 4), (2, 4)], [(3, 4)]]
    assert chunked == _run(ScriptedEngine(SCRIPT))


def test_engine_breaking_the_grouping_is_an_error():
    with pytest.raises(RuntimeError, match="not grouped as requested"):
        _run(ScriptedEngine(SCRIPT, shuffle=True))


def test_json_table_and_metrics(tmp_path):
    report = _run(ScriptedEngine(SCRIPT))
    path = tmp_path / "out" / "eval.json"
    ev.write_report(report, path)
    data = json.loads(path.read_text())
    assert data["ks"] == [1, 2] and data["n_samples"] == 4
    assert data["groups"]["beta"]["pass_at"] == {"pass@1": 0.75, "pass@2": 1.0}
    assert len(data["problems"]) == 3 and data["problems"][0]["status_counts"]["correct"] == 2
    table = ev.format_table(report).splitlines()
    assert table[0].split() == [
        "benchmark",
        "problems",
        "pass@1",
        "pass@2",
        "mean",
        "len",
        "no",
        "answer",
    ]
    assert table[2].split() == ["alpha", "2", "25.0", "41.7", "1.0", "12.5%"]
    assert table[-1].split()[:4] == ["overall", "3", "41.7", "61.1"]
    flat = ev.metrics(report)
    assert flat["eval/overall/pass@1"] == pytest.approx(1.25 / 3)
    assert flat["eval/beta/no_answer_share"] == 0.0


def test_harness_with_the_math_verify_pool():
    rows = [_row(10, "025", "aime"), _row(11, "\\frac{3}{5}", "math")]
    script = {10: ["... so \\boxed{25}", "\\boxed{250}"], 11: ["\\boxed{0.6}", "no idea"]}
    with RewardPool(RewardConfig(num_workers=2, timeout_s=3.0)) as pool:
        report = ev.evaluate(
            ScriptedEngine(script),
            rows,
            [(1,), (2,)],
            scorer=pool,
            decode=decode,
            sampling=SAMPLING,
            n_samples=2,
        )
    assert report.groups["aime"].pass_at == {1: 0.5}
    assert report.groups["math"].no_answer_share == 0.5
    assert report.groups["overall"].pass_at == {1: 0.5}


def test_cli_path_with_an_injected_engine(tmp_path, monkeypatch):
    engine = ScriptedEngine({})
    rows_seen = []

    def make_engine(run_config, checkpoint):
        assert checkpoint == "ckpt"
        return engine

    def generate(requests, sampling):
        rows_seen.extend(requests)
        assert (
            sampling.temperature == 1.0 and sampling.top_p == 1.0 and 2 in sampling.stop_token_ids
        )
        return [
            Completion(
                r.prompt_id,
                i,
                np.array([18 + i % 3, 2], np.int32),
                np.zeros(2, np.float32),
                "stop",
                0,
            )
            for r in requests
            for i in range(r.n)
        ]

    engine.generate = generate
    monkeypatch.setattr(ev, "make_engine", make_engine)
    run = types.SimpleNamespace(
        data=DataConfig(
            task="synthetic", system_prompt="", synthetic_op="copy", synthetic_modulus=3
        ),
        reward=RewardConfig(),
        init=types.SimpleNamespace(tokenizer=""),
        rollout=types.SimpleNamespace(max_new_tokens=4),
    )
    out = tmp_path / "eval.json"
    report = ev.run_from_config(
        run, "ckpt", output=str(out), n_samples=3, ks=[1, 8], max_problems=0, seed=0
    )
    # copy task over digits 0..2, responses cycle through "0", "1", "2": each problem 1 of 3 right
    assert len(rows_seen) == 3 and report.groups["overall"].pass_at == pytest.approx({1: 1 / 3})
    assert json.loads(out.read_text())["groups"]["synthetic_copy3"]["num_problems"] == 3
    assert engine.closed


def test_evaluate_validates_arguments():
    with pytest.raises(ValueError, match="3 rows and 2 prompts"):
        ev.evaluate(
            ScriptedEngine(SCRIPT),
            ROWS,
            PROMPTS[:2],
            scorer=SyntheticScorer(),
            decode=decode,
            sampling=SAMPLING,
            n_samples=4,
        )
    with pytest.raises(ValueError, match="no k"):
        _run(ScriptedEngine(SCRIPT), ks=(8,))
    assert dataclasses.is_dataclass(ev.EvalReport)


def test_in_loop_greedy_accuracy_per_group():
    """eval.greedy adds one T = 0 sample per problem, reported as eval_greedy/<group>/pass@1;
    the engine is told temperature 0 for it (a greedy engine returns its first script entry)."""
    seen = []

    class Greedy(ScriptedEngine):
        def generate(self, requests, sampling):
            seen.append((sampling.temperature, [r.n for r in requests]))
            return super().generate(requests, sampling)

    task = types.SimpleNamespace(
        eval_rows=ROWS,
        eval_prompt_tokens=PROMPTS,
        stop_token_ids=(2,),
        scorer=SyntheticScorer(),
        decode=decode,
    )
    cfg = types.SimpleNamespace(
        eval=EvalConfig(every_steps=1, n_samples=4, ks=(1, 2), max_problems=0, greedy=True),
        rollout=types.SimpleNamespace(max_new_tokens=4),
        train=types.SimpleNamespace(seed=0),
    )
    out = ev.evaluate_in_loop(Greedy(SCRIPT), task, cfg, step=0)
    assert seen == [(1.0, [4, 4, 4]), (0.0, [1, 1, 1])]
    assert out["eval/overall/pass@1"] == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)
    # first script entries "2", "1", "4" against golds 2, 3, 4: alpha 1 of 2, beta 1 of 1
    assert out["eval_greedy/alpha/pass@1"] == 0.5 and out["eval_greedy/beta/pass@1"] == 1.0
    assert out["eval_greedy/overall/pass@1"] == pytest.approx(2 / 3)
    cfg.eval = EvalConfig(every_steps=1, n_samples=4, ks=(1,), max_problems=0)
    assert not any(
        k.startswith("eval_greedy") for k in ev.evaluate_in_loop(Greedy(SCRIPT), task, cfg, 1)
    )
