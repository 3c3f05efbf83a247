"""data.paths = ("hf:org/name[:config][@split]",): Hub datasets through `datasets`, offline.

Each test builds a datasets cache in tmp_path with `datasets` itself: its JSON builder prepares
small local copies (GSM8K's and MATH-500's columns and answer formats) into the directory where
`load_dataset("<org>/<name>", <config>)` keeps a Hub dataset it has downloaded
(<cache>/<org>___<name>/<config>/0.0.0/<commit>); the reader then loads them by their Hub ids
with HF_HUB_OFFLINE=1, through the library's own offline path (the cached-dataset module).
"""

import json
import os

import pytest

from dynamo_jax.data import DataConfig, load_files, read_rows
from dynamo_jax.data import hub as data_hub
from dynamo_jax.errors import DataError

# datasets reads its offline switch once, when first imported (nothing else imports it): set
# before that, so that load_dataset goes to its cache without trying the Hub first.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
datasets = pytest.importorskip("datasets", reason="the [hub] extra is not installed")

COMMIT = "e53f048856ff4f594e959d75785d2c2d37b678ee"
GSM8K_TRAIN = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A company pays 1,000 dollars a day for 2 days. How much in total?",
        "answer": "It pays 1,000 * 2 = <<1000*2=2000>>2,000 dollars.\n#### 2,000",
    },
]
GSM8K_TEST = [
    {
        "question": "Janet's ducks lay 16 eggs per day. She eats three for breakfast every "
        "morning and bakes muffins for her friends every day with four. She sells the remainder "
        "at the farmers' market daily for $2 per fresh duck egg. How much in dollars does she "
        "make every day at the farmers' market?",
        "answer": "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n"
        "She makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's market.\n#### 18",
    }
]
MATH500_TEST = [
    {
        "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
        "solution": "We have that $r = 3$ ... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$",
        "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
        "subject": "Precalculus",
        "level": 2,
        "unique_id": "test/precalculus/807.json",
    },
    {
        "problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
        "solution": "$\\frac{1}{2} + \\frac{1}{4} = \\boxed{\\frac{3}{4}}$",
        "answer": "\\frac{3}{4}",
        "subject": "Prealgebra",
        "level": 1,
        "unique_id": "test/prealgebra/1.json",
    },
]


def cache_hub_dataset(cache, tmp_path, repo, config, splits, features=None):
    """`splits` ({split: rows}) prepared by datasets' JSON builder where `load_dataset(repo,
    config)` keeps a downloaded Hub dataset."""
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.json.json import Json

    org, name = repo.split("/")
    files = {}
    for split, rows in splits.items():
        file = tmp_path / "src" / repo / f"{split}.jsonl"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(file)
    config = config or "default"
    name = camelcase_to_snakecase(name)
    out = cache / f"{org}___{name}" / config / "0.0.0" / COMMIT
    builder = Json(
        cache_dir=str(tmp_path / "build"),
        config_name=config,
        config_id=config,
        dataset_name=name,
        data_files=files,
        features=features,
    )
    builder.download_and_prepare(output_dir=str(out))
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    cache = root / "datasets"
    cache_hub_dataset(
        cache, tmp_path, "openai/gsm8k", "main", {"train": GSM8K_TRAIN, "test": GSM8K_TEST}
    )
    cache_hub_dataset(cache, tmp_path, "HuggingFaceH4/MATH-500", None, {"test": MATH500_TEST})
    return cache


def test_the_cache_is_what_datasets_loads_offline(cache):
    loaded = datasets.load_dataset("openai/gsm8k", "main", split="test", cache_dir=str(cache))
    assert loaded.to_list() == GSM8K_TEST
    loaded = datasets.load_dataset("HuggingFaceH4/MATH-500", split="test", cache_dir=str(cache))
    assert loaded.to_list() == MATH500_TEST


def test_gsm8k_preset(cache):
    rows, reports = load_files(["hf:openai/gsm8k", "hf:openai/gsm8k:main@test"])
    assert [r.messages for r in rows] == [
        ({"role": "user", "content": r["question"]},) for r in GSM8K_TRAIN + GSM8K_TEST
    ]
    # The text after "####", thousands' commas dropped (verl's gsm8k preprocessing).
    assert [r.gold for r in rows] == ["72", "2000", "18"]
    assert {r.source for r in rows} == {"gsm8k"}
    assert [r.index for r in rows] == [0, 1, 2] and len({r.prompt_id for r in rows}) == 3
    assert [rep.loaded for rep in reports] == [2, 1]
    assert rows[2].origin == "hf:openai/gsm8k:main@test row 0"


def test_math500_preset(cache):
    rows = load_files(["hf:HuggingFaceH4/MATH-500"])[0]  # the preset's split: test
    assert [r.messages[0]["content"] for r in rows] == [r["problem"] for r in MATH500_TEST]
    assert [r.gold for r in rows] == [r["answer"] for r in MATH500_TEST]
    assert {r.source for r in rows} == {"MATH-500"}


def test_column_mapping_of_another_dataset(cache, tmp_path):
    rows = [{"q": "1+1?", "a": "2", "id": 7}, {"q": "2+2?", "a": "4", "id": 8}]
    cache_hub_dataset(cache, tmp_path, "someone/arith", None, {"train": rows})
    with pytest.raises(DataError, match=r"no column\(s\) \['prompt', 'answer'\]"):
        load_files(["hf:someone/arith"])
    loaded = load_files(["hf:someone/arith@train"], hub_columns=("q", "a"))[0]
    assert [(r.messages[0]["content"], r.gold) for r in loaded] == [("1+1?", "2"), ("2+2?", "4")]
    # GSM8K's own answer column, named explicitly, is taken whole (no "####" extraction).
    gsm = load_files(["hf:openai/gsm8k@test"], hub_columns=("question", "answer"))[0]
    assert gsm[0].gold.endswith("#### 18")


def test_bad_rows_are_one_line_naming_row_and_column_or_skipped(cache, tmp_path):
    bad = [
        {"question": "fine?", "answer": "yes\n#### 1"},
        {"question": "   ", "answer": "#### 2"},
        {"question": "no marker?", "answer": "just 3"},
        {"question": None, "answer": "#### 4"},
    ]
    cache_hub_dataset(cache, tmp_path, "openai/gsm8k", "bad", {"train": bad})
    spec = "hf:openai/gsm8k:bad"
    with pytest.raises(DataError) as err:
        load_files([spec])
    assert str(err.value) == f"{spec}: row 1: field 'prompt': empty prompt"
    rows, report = read_rows(spec, on_bad_row="skip")
    assert [r.gold for r in rows] == ["1"]
    assert report.skipped == 3
    assert report.skip_reasons[1:] == [
        f"{spec}: row 2: field 'answer': no '####' before the final answer",
        f"{spec}: row 3: field 'question': must be a str, got NoneType",
    ]


def test_not_cached_offline_is_one_line(cache):
    with pytest.raises(DataError) as err:
        load_files(["hf:someone/never-downloaded@train"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("hf:someone/never-downloaded@train: cannot load")
    assert "load_dataset('someone/never-downloaded', None)" in message


def test_specs_are_checked_with_the_config():
    cfg = DataConfig(task="math", paths=("hf:openai/gsm8k",), eval_paths=("hf:a/b:c@test",))
    assert cfg.paths == ("hf:openai/gsm8k",)
    parsed = data_hub.parse_spec("hf:openai/gsm8k")
    assert (parsed.repo, parsed.config, parsed.split) == ("openai/gsm8k", "main", "train")
    parsed = data_hub.parse_spec("hf:HuggingFaceH4/MATH-500")
    assert (parsed.config, parsed.split) == (None, "test")
    for bad in ("hf:gsm8k", "hf:a/b/c", "hf:a/b@", "hf:a/b:@x"):
        with pytest.raises(ValueError, match="expected 'hf:org/name"):
            DataConfig(task="math", paths=(bad,))


def test_a_math_config_reads_hub_specs_with_its_columns(cache, tmp_path):
    """The config's fields reach the reader: data.eval_paths' hf: specs and hub_*_column."""
    from configs import math_tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.models.tokenizer import tokenizer_from_spec
    from dynamo_jax.tasks import eval_problems

    rows = [{"q": "What is 6 times 7?", "a": "42"}]
    cache_hub_dataset(cache, tmp_path, "someone/times", None, {"test": rows})
    config = math_tiny.get_config()
    config.data.eval_paths = ("hf:openai/gsm8k@test", "hf:someone/times@test")
    config.data.hub_prompt_column = "q"
    with pytest.raises(DataError, match=r"hf:openai/gsm8k@test: no column\(s\) \['q'\]"):
        eval_problems(from_config_dict(config), tokenizer_from_spec("qwen2"))
    config.data.eval_paths = ("hf:someone/times@test",)
    config.data.hub_answer_column = "a"
    cfg = from_config_dict(config)
    problems, token_ids = eval_problems(cfg, tokenizer_from_spec(cfg.init.tokenizer))
    assert [(p.gold, p.source) for p in problems] == [("42", "times")]
    text = tokenizer_from_spec("qwen2").decode(token_ids[0])
    assert "What is 6 times 7?" in text and cfg.data.system_prompt in text


@pytest.mark.slow  # ~1-2 min on 2 cores: the Qwen2 vocabulary's embedding, math-verify workers
def test_a_run_trains_and_evaluates_on_hub_datasets(cache, tmp_path):
    """One step of configs/math_tiny.py on hf:openai/gsm8k:socratic, evaluated on
    hf:HuggingFaceH4/MATH-500: the workdir's input check lets hf: specs through, the run trains
    and reports per dataset."""
    from configs import math_tiny
    from dynamo_jax.config import from_config_dict
    from dynamo_jax.loop import train
    from dynamo_jax.reporting.metrics import read_metrics

    train_rows = [{"question": f"What is {i} + 3?", "answer": f"{i}+3={i + 3}\n#### {i + 3}"}
                  for i in range(8)]  # fmt: skip
    cache_hub_dataset(cache, tmp_path, "openai/gsm8k", "socratic", {"train": train_rows})
    config = math_tiny.get_config()
    config.data.paths = ("hf:openai/gsm8k:socratic",)
    config.data.eval_paths = ("hf:HuggingFaceH4/MATH-500",)
    config.train.steps = 1
    config.checkpoint.every_steps = 1
    config.eval.every_steps = 1
    config.logging.progress_bar = False
    config.logging.tensorboard = False
    config.logging.plots_at_end = False
    summary = train.run(from_config_dict(config), tmp_path / "run")
    assert summary.exit_code == 0
    (record,) = read_metrics(tmp_path / "run")
    assert "eval/MATH-500/pass@1" in record and "reward/mean" in record
