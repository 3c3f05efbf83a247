#!/usr/bin/env bash
# Create the separate virtual environment that benchmarks/peer_trl.py runs TRL in (docs/peer_trl.md).
# TRL pins its own torch/transformers/accelerate, so it never shares the trainer's environment,
# and it is never installed in CI: the benchmark is a manual, side-by-side measurement.
#   usage: bash scripts/make_trl_venv.sh [VENV_DIR]   (default: .venv-trl)
# The CPU torch wheel goes in first and pinned, so TRL's torch requirement is already met and no
# CUDA build is pulled. The benchmark is written against TRL 1.16's GRPOTrainer: keep the pins.
set -euo pipefail
venv="${1:-.venv-trl}"
TORCH_PACKAGE="${TORCH_PACKAGE:-torch==2.13.0}"
TRL_PACKAGE="${TRL_PACKAGE:-trl==1.16.0}"
echo "creating $venv with $TORCH_PACKAGE and $TRL_PACKAGE"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip >/dev/null
"$venv/bin/pip" install -q "$TORCH_PACKAGE"
# safetensors reads the exported weights; numpy for the timing tables. TRL brings transformers,
# accelerate and datasets at versions it supports.
"$venv/bin/pip" install -q "$TRL_PACKAGE" safetensors numpy
# Vision/audio extras come in as mismatched builds and break transformers' imports on CPU; text
# models need none.
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import torch, trl, transformers; print('trl venv ready: trl', trl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
