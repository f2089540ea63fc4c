#!/usr/bin/env bash
# Builds pyspark's wheel once from its source archive (the only form PyPI has) into streamproof's cache, where
# make setup installs it from (the Makefile says why). Usage: scripts/pyspark-wheel.sh PYTHON pyspark==X.Y.Z WHEEL
set -euo pipefail
python=$1 pin=$2 wheel=$3
[[ -f $wheel ]] && exit 0
folder=$(dirname "$wheel")
mkdir -p "$folder"
building=$(mktemp -d "$folder/.building-XXXXXX")
trap 'rm -rf "$building"' EXIT
echo "building $pin's wheel once (about 20 s) into $folder"
# pip's own cache would keep a second copy of the 450 MB archive
"$python" -m pip wheel -q --no-cache-dir --no-deps "$pin" -w "$building"
built=("$building"/*.whl)
if [[ ${#built[@]} -ne 1 || $(basename "${built[0]}") != $(basename "$wheel") ]]; then
  echo "error: building $pin gave ${built[*]##*/}, not $(basename "$wheel")" >&2
  exit 2
fi
mv "${built[0]}" "$wheel"  # the same folder: a rename, so an interrupted build never leaves half a wheel
