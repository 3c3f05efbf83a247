"""The exported directory's model card, and `export --push`: the upload to a Hub model repo.

`model_card(cfg, step, records)` is the README.md the Hub shows: YAML metadata
(`huggingface_hub.ModelCardData`: library, tags, the base model when the run started from a Hub
model), the run's method (loss variant, rollout allocation, temperature schedule), its data,
the held-out pass@k of the last evaluation at or before the exported step, and the resolved
config. `push_to_hub(out_dir, repo_id)` creates the repo if needed (`HfApi.create_repo`,
exist_ok) and uploads the directory (`HfApi.upload_folder`): the library's own authentication
(HF_TOKEN, `hf auth login`), endpoint (HF_ENDPOINT) and offline switch (HF_HUB_OFFLINE) apply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from dynamo_jax.config import RunConfig, to_json_dict
from dynamo_jax.errors import ConfigError, UserError
from dynamo_jax.reporting.summary import final_eval_values

CARD_FILE = "README.md"
OVERALL = "overall"  # evaluate.OVERALL (evaluate is a layer above; not imported)
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
# A Hub snapshot directory (models/hub.py resolves init.checkpoint into one) names its repo.
_SNAPSHOT = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/[0-9a-f]+/?$")


def check_repo_id(repo_id: str) -> str:
    if not _REPO_ID.fullmatch(repo_id):
        raise ConfigError(f"--push {repo_id!r}: expected a Hub model repo id 'org/name'")
    return repo_id


def base_model(checkpoint: str) -> str | None:
    """The Hub id of the run's initial weights, when they came from a Hub snapshot."""
    match = _SNAPSHOT.search(checkpoint)
    return f"{match.group(1)}/{match.group(2)}" if match else None


def _held_out(cfg: RunConfig, step: int, records: Sequence[dict]) -> list[str]:
    upto = [r for r in records if int(r.get("step", -1)) <= step]
    values = final_eval_values(upto, OVERALL)
    if not values:
        return [
            "No held-out evaluation was recorded up to this step "
            f"(eval.every_steps = {cfg.eval.every_steps})."
        ]
    at = values.pop("final_eval/step")
    where = ", ".join(cfg.data.eval_paths or cfg.data.paths) or f"synthetic ({cfg.data.task})"
    lines = [
        f"pass@k at step {at}, {cfg.eval.n_samples} samples per problem (temperature 1), on "
        f"{where}:",
        "",
        "| group | metric | value |",
        "|---|---|---|",
    ]
    for key, value in values.items():
        _, group, metric = key.split("/")
        lines.append(f"| {group} | {metric} | {value:.4f} |")
    return lines


def model_card(cfg: RunConfig, step: int, records: Sequence[dict]) -> str:
    """The README.md text of an export of `cfg`'s run at `step` (`records`: its metrics.jsonl)."""
    from huggingface_hub import ModelCardData

    base = base_model(cfg.init.checkpoint)
    data = ModelCardData(
        library_name="transformers",
        tags=["dynamo_jax", "reinforcement-learning", "rlvr", cfg.loss.variant],
        base_model=base,
    )
    start = f"[{base}](https://huggingface.co/{base})" if base else (
        f"`{cfg.init.checkpoint}`" if cfg.init.checkpoint else "random initial weights"
    )  # fmt: skip
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {cfg.name}",
        "",
        f"Trained with dynamo_jax (RL with verifiable rewards) from {start}: step {step} of "
        f"{cfg.train.steps}.",
        "",
        "| | |",
        "|---|---|",
        f"| method (`loss.variant`) | {cfg.loss.variant} |",
        f"| rollout allocation (`allocation.policy`) | {cfg.allocation.policy}, "
        f"n_avg {cfg.allocation.n_avg} |",
        f"| temperature (`temperature.mode`) | {cfg.temperature.mode} |",
        f"| data (`data.paths`) | {', '.join(cfg.data.paths) or cfg.data.task} |",
        f"| prompts per step, learning rate | {cfg.train.prompts_per_step}, "
        f"{cfg.optim.learning_rate:g} |",
        "",
        "## Held-out figures",
        "",
        *_held_out(cfg, step, records),
        "",
        "## Config",
        "",
        "The run's resolved config (dynamo_jax `RunConfig`):",
        "",
        "```json",
        json.dumps(to_json_dict(cfg), indent=1),
        "```",
        "",
    ]
    return "\n".join(lines)


def write_model_card(out_dir: Path, cfg: RunConfig, step: int, records: Sequence[dict]) -> Path:
    from huggingface_hub import ModelCard

    path = Path(out_dir) / CARD_FILE
    ModelCard(model_card(cfg, step, records)).save(path)
    return path


def upload_arguments(out_dir: Path, repo_id: str) -> dict:
    """The keyword arguments of `HfApi.upload_folder` for the exported directory."""
    return {
        "repo_id": repo_id,
        "folder_path": str(out_dir),
        "repo_type": "model",
        "commit_message": f"dynamo_jax export of {Path(out_dir).name}",
    }


def push_to_hub(out_dir: Path, repo_id: str, *, private: bool = False) -> str:
    """Upload `out_dir` to the Hub model repo `repo_id` (created if absent); the commit's URL."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise UserError("--push needs huggingface_hub: pip install 'dynamo_jax[hub]'") from None
    api = HfApi()
    try:
        api.create_repo(check_repo_id(repo_id), repo_type="model", private=private, exist_ok=True)
        info = api.upload_folder(**upload_arguments(out_dir, repo_id))
    except OSError as exc:  # huggingface_hub's HTTP and offline errors are OSErrors
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise UserError(
            f"--push {repo_id}: the upload failed ({type(exc).__name__}: "
            f"{lines[0] if lines else ''}); {out_dir} is exported, push it later with "
            f"`hf upload {repo_id} {out_dir}`"
        ) from None
    return str(getattr(info, "commit_url", info))
