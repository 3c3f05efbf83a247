"""Base-model pass@1 and completion lengths for candidate instructions (configs/smollm2_arith.py).

    python scripts/measure_instructions.py --problems 40 --samples 4

For each candidate system instruction: held-out problems (the first --problems of
data/arith/test.jsonl, levels interleaved), --samples completions each at T = 1 plus one greedy,
scored two ways: math-verify (the run's default scorer) and "number": the last number written
equals the gold (a restated question such as "12 + 5" ends in 5 and fails). Prints one line per
candidate: pass@1 both ways, greedy accuracy, mean completion tokens, share cut at the limit.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np

from configs import smollm2_arith
from dynamo_jax import tasks
from dynamo_jax.config import from_config_dict
from dynamo_jax.data.config import QWEN_MATH_SYSTEM_PROMPT
from dynamo_jax.evaluate import make_engine
from dynamo_jax.models.fetch import resolve_init
from dynamo_jax.models.tokenizer import stop_token_ids
from dynamo_jax.rollout.protocol import Request, SamplingParams

CANDIDATES = {
    "number_only": ("Answer with only the final number.", 24),
    "calculator_example": (smollm2_arith.INSTRUCTION, 24),
    "brief_then_answer": (
        "Think briefly, then end with 'The answer is N.' where N is a number.",
        64,
    ),
    "cot_boxed": (QWEN_MATH_SYSTEM_PROMPT, 96),
}
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def number_correct(text: str, gold: str) -> bool:
    nums = _NUM.findall(text.replace(",", ""))
    return bool(nums) and float(nums[-1]) == float(gold)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--problems", type=int, default=40)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--only", default="")
    args = p.parse_args()
    for name, (instruction, max_new) in CANDIDATES.items():
        if args.only and name not in args.only.split(","):
            continue
        cfg = smollm2_arith.get_config()
        cfg.data.system_prompt = instruction
        cfg.rollout.max_new_tokens = max_new
        rc = resolve_init(from_config_dict(cfg))
        tok = tasks.task_tokenizer(rc)
        rows, prompts = tasks.eval_problems(rc, tok, args.problems)
        engine = make_engine(rc, rc.init.checkpoint)
        scorer = tasks.make_scorer(rc)
        stops = stop_token_ids(tok)
        reqs = [Request(r.prompt_id, tuple(ids), args.samples) for r, ids in zip(rows, prompts)]
        t = time.time()
        comps = engine.generate(
            reqs,
            SamplingParams(max_new_tokens=max_new, temperature=1.0, stop_token_ids=stops, seed=1),
        )
        gen_s = time.time() - t
        greedy = engine.generate(
            [Request(r.prompt_id, tuple(ids), 1) for r, ids in zip(rows, prompts)],
            SamplingParams(max_new_tokens=max_new, temperature=0.0, stop_token_ids=stops, seed=1),
        )
        texts = [tok.decode(list(c.token_ids), skip_special_tokens=True) for c in comps]
        golds = [r.gold for r in rows for _ in range(args.samples)]
        mv = np.mean([v.status == "correct" for v in scorer.score(texts, golds)])
        num = np.mean([number_correct(t, g) for t, g in zip(texts, golds)])
        gtexts = [tok.decode(list(c.token_ids), skip_special_tokens=True) for c in greedy]
        gnum = np.mean([number_correct(t, r.gold) for t, r in zip(gtexts, rows)])
        lens = np.array([len(c.token_ids) for c in comps])
        cut = np.mean([len(c.token_ids) >= max_new for c in comps])
        print(
            f"{name:18s} max_new={max_new:3d} pass@1 math-verify={mv:.3f} number={num:.3f} "
            f"greedy(number)={gnum:.3f} mean_tokens={lens.mean():.1f} cut={cut:.2f} "
            f"gen_s={gen_s:.0f} ({lens.sum() / gen_s:.0f} tok/s)  e.g. {texts[0]!r} | {texts[3]!r}",
            flush=True,
        )
        scorer.close()
        engine.close()


if __name__ == "__main__":
    main()
