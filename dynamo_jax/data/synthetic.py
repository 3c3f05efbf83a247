"""A synthetic verifiable task that a randomly initialised 2-layer model learns by RL on CPU.

Problems are one-digit arithmetic over 0..m-1 (m = `modulus` ≤ 10), so every answer is ONE
token, and the policy only has to put the right digit first:

    copy    "copy 3="       → "3"    (m problems)      attend to one prompt digit
    max     "max(3,1)="     → "3"    (m² problems)     copy one of two digits, compare (default)
    add_mod "3+4 mod 5="    → "2"    (m² problems)     a lookup table over pairs (hardest)
    mixed   copy, max and min problems together (m + 2m² problems), told apart by the op word

Learnability (why these choices): the tokenizer has 32 tokens, so a random policy's first token
is the right digit with p ≈ 1/32 and the answer check below accepts it whatever non-digit
follows: with 2-token responses p = 26/1024 ≈ 2.5% at step 0 (enumerated in the tests), about
1.6 rewarded samples in each 8 prompts × 8 samples batch, enough for GRPO to get signal. The
default, max with m = 5, then pays off in stages: emitting a digit of the prompt is right at
least half the time, comparing gives the rest. Measured with configs/tiny.py (tiny-qwen3,
2 layers; GRPO, 16 prompts × 8 samples, lr 2e-3): mean reward 0.04 at step 1, 0.51 at step 51,
about 0.85 from step 100. add_mod with m = 5 plateaued at 1/m ≈ 0.2 after 200 steps (lr 1e-3):
the output range is learnt quickly, the 25-entry table is not; use it as the harder setting.

`mixed` is the multi-skill setting: three skills of spread difficulty (copy reads one prompt
digit, max and min compare in opposite directions), and its answers are balanced (each digit
answers exactly 2m + 1 problems: max's answers lean high as much as min's lean low), so no
single answer digit solves more than 1/m of it. On `max` alone every prompt shares one skill and
"answer a large digit" pays (3 or 4 answers 16 of its 25 problems at m = 5). Measured with
configs/tiny.py:task=mixed (GRPO, lr 5e-4, 5 seeds): per-prompt mean reward 0.9 after 132-157
steps, final greedy answers wrong on 0-3 of the 55 problems after 300 steps.

The reward is binary with no shaping: the answer is the run of digits the response starts
with (after optional whitespace; text after the stop token is ignored); it is correct iff it
equals the gold digits exactly, so "2" and "2 +" answer 2 but "23", "+2" and "" do not. The text is model output, so it is still handled as untrusted: bounded length, only
string comparisons, nothing evaluated.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dynamo_jax.data.rows import Row, hash_id
from dynamo_jax.rewards.config import RewardConfig
from dynamo_jax.rewards.verdict import Verdict, make_verdict

PAD, BOS_TURN, EOS, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
_SPECIALS = (PAD, BOS_TURN, EOS, UNK)
_WORDS = ("system", "user", "assistant", "copy", "max", "mod")
_SYMBOLS = ("\n", " ", "+", "=", "(", ")", ",", "?")
_DIGITS = tuple(str(d) for d in range(10))
# Filler so the vocabulary is 32 entries (divisible by a tensor-parallel axis of 2, 4 or 8);
# ordinary tokens, so a policy that samples one produces visible (wrong) text.
_FILLER = ("<fa>", "<fb>", "<fc>")
# Words added later take a filler's place at the end, so every older token keeps its id (and a
# seeded run of an older op its random embedding rows, hence its trajectory).
_LATE_WORDS = ("min",)
VOCAB: tuple[str, ...] = _SPECIALS + _WORDS + _SYMBOLS + _DIGITS + _FILLER + _LATE_WORDS
SYNTHETIC_VOCAB_SIZE = len(VOCAB)
assert SYNTHETIC_VOCAB_SIZE == 32

# Qwen's chat format, so prompts go through the same templating path as the real data.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

OPS = ("copy", "max", "add_mod", "mixed")
MAX_RESPONSE_CHARS = 256


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """op: which task; modulus: operands are 0..modulus-1; num_rows: 0 = every distinct problem
    once, otherwise that many rows (a seeded subset, or whole reshuffled passes repeated)."""

    op: str = "max"
    modulus: int = 5
    num_rows: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"SyntheticConfig.op must be one of {OPS}, got {self.op!r}")
        if not 2 <= self.modulus <= 10:
            raise ValueError(f"SyntheticConfig.modulus must be in [2, 10], got {self.modulus}")
        if self.num_rows < 0:
            raise ValueError(f"SyntheticConfig.num_rows must be >= 0, got {self.num_rows}")


def synthetic_tokenizer() -> PreTrainedTokenizerFast:
    """The task's word-level tokenizer (32 tokens, Qwen-style chat template, eos <|im_end|>)."""
    vocab = {token: i for i, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    words = "|".join(re.escape(w) for w in _WORDS + _FILLER + _LATE_WORDS)
    # Each word, or else each single character, is one piece; unknown pieces map to <unk>.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{words}|[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[BOS_TURN],
        chat_template=CHAT_TEMPLATE,
    )


def _problems(op: str, m: int) -> list[tuple[str, str]]:
    """Every distinct (prompt text, gold) of the task, in a fixed order."""
    pairs = list(itertools.product(range(m), repeat=2))
    if op == "copy":
        return [(f"copy {a}=", str(a)) for a in range(m)]
    if op == "max":
        return [(f"max({a},{b})=", str(max(a, b))) for a, b in pairs]
    if op == "mixed":
        minimum = [(f"min({a},{b})=", str(min(a, b))) for a, b in pairs]
        return _problems("copy", m) + _problems("max", m) + minimum
    return [(f"{a}+{b} mod {m}=", str((a + b) % m)) for a, b in pairs]


def make_synthetic_dataset(cfg: SyntheticConfig) -> list[Row]:
    """Rows of the task; ids hash (task, prompt, repeat number), so they are stable and unique."""
    problems = _problems(cfg.op, cfg.modulus)
    source = f"synthetic_{cfg.op}{cfg.modulus}"
    order = list(range(len(problems)))
    if cfg.num_rows:
        rng = np.random.default_rng(cfg.seed)
        passes = -(-cfg.num_rows // len(problems))
        order = np.concatenate([rng.permutation(len(problems)) for _ in range(passes)])
        order = [int(i) for i in order[: cfg.num_rows]]
    seen: dict[int, int] = {}
    rows = []
    for index, problem in enumerate(order):
        text, gold = problems[problem]
        repeat = seen.get(problem, 0)
        seen[problem] = repeat + 1
        prompt_id = hash_id(source, text, f"#{repeat}")
        rows.append(Row(prompt_id, index, ({"role": "user", "content": text},), gold, source))
    return rows


def _answer_text(text: str) -> str:
    # Everything after the stop token (if the caller decoded with special tokens) is not part
    # of the response; the other special strings are dropped.
    text = text.split(EOS, 1)[0]
    for special in (PAD, BOS_TURN):
        text = text.replace(special, "")
    return text


def synthetic_verdict(text, gold: str, cfg: RewardConfig | None = None) -> Verdict:
    """Binary verdict: the digits the response starts with must equal `gold` exactly."""
    cfg = cfg or RewardConfig()
    if not isinstance(text, str):
        return make_verdict("parse_error", cfg, detail=f"completion is {type(text).__name__}")
    if len(text) > MAX_RESPONSE_CHARS:
        return make_verdict("parse_error", cfg, detail=f"response longer than {MAX_RESPONSE_CHARS}")
    match = re.match(r"\s*(\d+)", _answer_text(text))
    if match is None:
        return make_verdict("no_answer", cfg, detail="the response does not start with digits")
    answer = match.group(1)
    return make_verdict("correct" if answer == gold else "wrong", cfg, answer=answer)


class SyntheticScorer:
    """Same interface as `RewardPool` (context manager, `score`), scoring in-process."""

    def __init__(self, cfg: RewardConfig | None = None):
        self.cfg = cfg or RewardConfig()

    def __enter__(self) -> SyntheticScorer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def score(
        self, completions_text: Sequence[str], golds: Sequence[str], sources=None, extra_infos=None
    ) -> list[Verdict]:
        """Verdicts in input order (`sources` / `extra_infos`: the pool's signature, unused)."""
        if len(completions_text) != len(golds):
            raise ValueError(
                f"score: {len(completions_text)} completions but {len(golds)} gold answers"
            )
        return [synthetic_verdict(t, g, self.cfg) for t, g in zip(completions_text, golds)]

    def close(self) -> None:
        pass
