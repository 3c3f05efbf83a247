"""The end-of-run summary: reward first → last, last eval, outputs, export command, exit code."""

from pathlib import Path

import pytest

from dynamo_jax.reporting.summary import (
    RunSummary,
    Status,
    format_summary,
    last_eval,
    reward_first_last,
)


def _records(n):
    # reward/mean = step / 100: steps 1..n.
    return [{"step": s, "reward/mean": s / 100} for s in range(1, n + 1)]


def _summary(**kw):
    base = dict(
        name="tiny",
        workdir=Path("/runs/w"),
        status=Status.FINISHED,
        reason="",
        start_step=0,
        last_step=20,
        total_steps=20,
        checkpoint_step=20,
        skipped_updates=0,
        tensorboard=True,
        plots=True,
    )
    return RunSummary(**{**base, **kw})


def test_reward_first_last_averages_a_fifth_of_the_run_up_to_five_steps():
    # 20 steps: k = min(5, 20 // 5) = 4; first = (1+2+3+4)/4/100 = 0.025, last = (17..20) = 0.185.
    assert reward_first_last(_records(20)) == ("0.025 → 0.185", "mean of steps 1-4 → 17-20")
    # 100 steps: k = 5; (1..5) → 0.03, (96..100) → 0.98.
    assert reward_first_last(_records(100)) == ("0.030 → 0.980", "mean of steps 1-5 → 96-100")
    # 3 steps: k = 1.
    assert reward_first_last(_records(3)) == ("0.010 → 0.030", "mean of steps 1 → 3")
    # Non-finite rewards are stored as strings and left out.
    records = _records(2) + [{"step": 3, "reward/mean": "nan"}]
    assert reward_first_last(records) == ("0.010 → 0.020", "mean of steps 1 → 2")
    assert reward_first_last([]) is None


def test_last_eval_takes_the_overall_pass_at_k_of_the_last_evaluation():
    records = [
        {"step": 5, "eval/overall/pass@1": 0.25, "eval/overall/pass@4": 0.5},
        {"step": 10, "eval/overall/pass@4": 0.75, "eval/overall/pass@1": 0.5, "eval/a/pass@1": 0.0},
        {"step": 11, "reward/mean": 0.3},
    ]
    assert last_eval(records, "overall") == (10, {1: 0.5, 4: 0.75})
    assert last_eval(records, "a") == (10, {1: 0.0})
    assert last_eval(records[2:], "overall") is None


@pytest.mark.parametrize(
    "status,last_step,code",
    [
        (Status.FINISHED, 20, 0),
        (Status.INTERRUPTED, 7, 3),  # SIGTERM/Ctrl-C: checkpointed, resumes with the same command
        (Status.ABORTED, 7, 5),  # a second SIGTERM/Ctrl-C: stopped at once
        (Status.NONFINITE, 7, 4),
        (Status.FAILED, 7, 1),
        (Status.FINISHED, 7, 1),  # stopped before its last step for any other reason
    ],
)
def test_exit_code(status, last_step, code):
    assert _summary(status=status, last_step=last_step).exit_code == code


def test_the_printed_block_of_a_finished_resumed_run():
    records = _records(20)
    records[9]["eval/overall/pass@1"] = 0.125
    text = format_summary(_summary(start_step=10), records, "overall")
    assert text.splitlines() == [
        "run tiny finished at step 20 of 20 (resumed at step 10; this launch ran steps 11-20)",
        "  reward/mean  0.025 → 0.185  (mean of steps 1-4 → 17-20)",
        "  eval         pass@1 0.125  (step 10)",
        "  checkpoint   /runs/w/checkpoints/20",
        "  metrics      /runs/w/metrics.jsonl; TensorBoard: tensorboard --logdir /runs/w/tb; "
        "plots: /runs/w/plots",
        "  export       python -m dynamo_jax.export /runs/w /runs/w/hf_step20",
    ]


def test_the_printed_block_says_why_a_run_stopped():
    text = format_summary(
        _summary(
            status=Status.NONFINITE,
            reason="3 non-finite updates in a row",
            last_step=7,
            checkpoint_step=6,
            skipped_updates=3,
            tensorboard=False,
            plots=False,
        ),
        _records(7),
        "overall",
    )
    assert text.splitlines()[0] == (
        "run tiny stopped: non-finite updates after step 7 of 20: 3 non-finite updates in a row"
    )
    assert "  non-finite   3 update(s) skipped" in text
    assert "  checkpoint   /runs/w/checkpoints/6" in text
    assert "  metrics      /runs/w/metrics.jsonl\n" in text
    interrupted = _summary(status=Status.INTERRUPTED, last_step=2, checkpoint_step=2)
    text = format_summary(interrupted, _records(2), "overall")
    assert text.startswith("run tiny interrupted after step 2 of 20; checkpointed, rerun to resume")
    text = format_summary(
        _summary(status=Status.INTERRUPTED, reason="SIGTERM", last_step=2, checkpoint_step=1),
        _records(2),
        "overall",
    )
    assert text.startswith("run tiny interrupted (SIGTERM) after step 2 of 20; NOT checkpointed")
    text = format_summary(
        _summary(status=Status.INTERRUPTED, reason="SIGTERM before the first step", start_step=2,
                 last_step=2, checkpoint_step=2),
        _records(2),
        "overall",
    )  # fmt: skip
    assert text.startswith(
        "run tiny interrupted (SIGTERM before the first step) after step 2 of 20; no step ran, "
        "rerun to resume"
    )
    text = format_summary(
        _summary(checkpoint_step=None, last_step=0, status=Status.FAILED, reason="DataError: x"),
        [],
        "overall",
    )
    assert text.splitlines()[1:3] == ["  no steps recorded", "  checkpoint   none written"]
    assert "export" not in text


def test_before_and_after_when_the_base_model_was_evaluated():
    """eval.at_start writes step 0; the summary then shows before → after overall, per group
    (difficulty level) and greedy."""
    records = [
        {"step": 0, "eval/overall/pass@1": 0.2, "eval/overall/pass@8": 0.5,
         "eval/add1/pass@1": 0.4, "eval/add1/pass@8": 0.9, "eval/word/pass@1": 0.1,
         "eval/word/pass@8": 0.3, "eval_greedy/overall/pass@1": 0.25},
        *_records(20),
        {"step": 20, "reward/mean": 0.2, "eval/overall/pass@1": 0.35, "eval/overall/pass@8": 0.6,
         "eval/add1/pass@1": 0.6, "eval/add1/pass@8": 0.95, "eval/word/pass@1": 0.2,
         "eval/word/pass@8": 0.4, "eval_greedy/overall/pass@1": 0.45},
    ]  # fmt: skip
    text = format_summary(_summary(), records, "overall")
    assert "  eval         pass@1 0.200 → 0.350, pass@8 0.500 → 0.600  (step 0 → 20)" in text
    assert "    add1       pass@1 0.400 → 0.600, pass@8 0.900 → 0.950" in text
    assert "    word       pass@1 0.100 → 0.200, pass@8 0.300 → 0.400" in text
    assert "  greedy       accuracy 0.250 → 0.450" in text
    # No step-0 evaluation (an earlier one at step 10 is not "before"): the last one only.
    for others in ([], [{"step": 10, "eval/overall/pass@1": 0.3, "eval/overall/pass@8": 0.5}]):
        text = format_summary(_summary(), others + records[1:], "overall")
        assert "  eval         pass@1 0.350, pass@8 0.600  (step 20)" in text
        assert "→ 0.350" not in text
