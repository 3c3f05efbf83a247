"""Export a run's checkpoint as a Hugging Face directory (config.json + model.safetensors).

    python -m dynamo_jax.export WORKDIR OUT_DIR [--step N] [--dtype bfloat16] [--push org/name]

Reads WORKDIR/config.json (written by every run) for the model shape, restores the parameters of
the latest (or the given) checkpoint step onto this process's default device, and writes a
directory that `transformers.AutoModelForCausalLM.from_pretrained` loads, with the tokenizer
files when the run used an HF tokenizer (`init.tokenizer`), and a model card (README.md: the
run's method, its held-out pass@k, the resolved config; export_card.py). `--push org/name`
then uploads the directory to that Hub model repo (created if absent, `--private` to make it
private) with `huggingface_hub.HfApi.upload_folder`, authenticated as the library is (HF_TOKEN
or `hf auth login`); a failed push is one line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax

from dynamo_jax.checkpoint import CheckpointConfig, Checkpointer, DamagedStepError
from dynamo_jax.config import RunConfig, from_config_dict
from dynamo_jax.errors import CheckpointError, UserError
from dynamo_jax.export_card import check_repo_id, push_to_hub, write_model_card
from dynamo_jax.reporting.metrics import read_metrics


def restore_params(workdir: Path, cfg: RunConfig, step: int | None):
    """(step, params) of a checkpoint in `workdir`, restored unsharded on the default device.

    Reads only the `params` item (checksum verified): no optimizer is built or read. A damaged
    newest step is reported and the previous one used; nothing in `workdir` is changed."""
    from dynamo_jax.models.qwen import param_shapes

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    place = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    abstract = {"params": jax.tree.map(place, param_shapes(cfg.model))}
    ckpt = Checkpointer(workdir / "checkpoints", CheckpointConfig(), read_only=True)
    try:
        if step is None:
            restored = ckpt.restore_latest(abstract, host=False)
            if restored is None:
                raise CheckpointError(f"{workdir}/checkpoints: no checkpoint to export")
        else:
            if step not in ckpt.all_steps():
                raise CheckpointError(
                    f"{workdir}/checkpoints: no step {step} (have {ckpt.all_steps()})"
                )
            try:
                restored = ckpt.restore(step, abstract, host=False)
            except DamagedStepError as err:
                raise CheckpointError(f"{workdir}/checkpoints/{step} is damaged: {err}") from err
    finally:
        ckpt.close()
    return restored.step, restored.device["params"]


def export(
    workdir: str | Path, out_dir: str | Path, *, step: int | None = None, dtype: str = "bfloat16"
) -> Path:
    from dynamo_jax.models.hf_io import save_hf_checkpoint

    workdir = Path(workdir)
    config_path = workdir / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{workdir}: no config.json (is this a run directory?)")
    cfg = from_config_dict(json.loads(config_path.read_text()))
    step, params = restore_params(workdir, cfg, step)
    tokenizer = None
    if cfg.init.tokenizer:
        from dynamo_jax.models.fetch import resolve_checkpoint
        from dynamo_jax.models.tokenizer import tokenizer_from_spec

        # config.json holds the resolved directory; a Hub id written by hand resolves here.
        tokenizer = tokenizer_from_spec(resolve_checkpoint(cfg.init.tokenizer))
    out = save_hf_checkpoint(params, cfg.model, out_dir, tokenizer=tokenizer, dtype=dtype)
    write_model_card(Path(out), cfg, step, read_metrics(workdir))
    print(f"exported step {step} of {workdir} to {out}")
    return Path(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir")
    parser.add_argument("out_dir")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default latest)")
    parser.add_argument("--dtype", default="bfloat16", help="safetensors dtype")
    parser.add_argument("--push", metavar="ORG/NAME", default="", help="upload to this Hub repo")
    parser.add_argument("--private", action="store_true", help="with --push: a private repo")
    args = parser.parse_args(argv)
    try:
        if args.push:
            check_repo_id(args.push)  # before the export's minutes, not after
        out = export(args.workdir, args.out_dir, step=args.step, dtype=args.dtype)
        if args.push:
            url = push_to_hub(out, args.push, private=args.private)
            print(f"pushed {out} to {url}")
    except UserError as err:  # bad input: one line, no traceback (as launch.py does)
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
