#!/usr/bin/env bash
# Builds kafka-delta-ingest (delta-io's Rust ingester) once, into streamproof's cache, for `streamproof bench
# throughput`'s side of it (streamproof/bench/kafka_delta_ingest.py). Not part of `make setup`: 18-22 minutes of
# 2 cores (its release profile links with LTO). Idempotent: a binary built before is kept.
#   make kafka-delta-ingest                      # its source cloned from GitHub at the commit below
#   KDI_SOURCE=~/src/kafka-delta-ingest make kafka-delta-ingest   # a checkout you have
set -euo pipefail

commit=c6d42de  # streamproof/bench/kafka_delta_ingest.py SOURCE_COMMIT: the figures of docs/performance.md
cache="${STREAMPROOF_CACHE:-$HOME/.cache/streamproof}/kafka-delta-ingest"  # as streamproof.jvm.jars.cache_root
binary="$cache/bin/kafka-delta-ingest"
if [ -x "$binary" ]; then
  echo "kafka-delta-ingest: $binary (built before; delete it to build again)"
  exit 0
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found: install Rust with rustup (https://rustup.rs), then run this again" >&2
  exit 2
fi
# rdkafka-sys builds librdkafka from source: make, cmake, a C++ compiler, OpenSSL's and zlib's headers.
missing=()
for package in make cmake g++ pkg-config libssl-dev zlib1g-dev; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq "${missing[@]}"
fi
source="${KDI_SOURCE:-}"
if [ -z "$source" ]; then
  source="$cache/src"
  if [ ! -d "$source/.git" ] && ! git clone --quiet https://github.com/delta-io/kafka-delta-ingest "$source"; then
    rm -rf "$source"
    echo "error: could not clone https://github.com/delta-io/kafka-delta-ingest: get its source another way and" \
      "run KDI_SOURCE=<its checkout at $commit> make kafka-delta-ingest" >&2
    exit 2
  fi
  git -C "$source" checkout --quiet "$commit"
elif [ -d "$source/.git" ] && [ "$(git -C "$source" rev-parse --short=7 HEAD)" != "$commit" ]; then
  echo "warning: $source is at $(git -C "$source" rev-parse --short=7 HEAD), not $commit (the bench's figures)" >&2
fi
echo "building kafka-delta-ingest from $source (cargo build --release; 18-22 minutes on 2 cores)"
# Its build.rs refuses a build without one object store's feature; the bench reads and writes local tables, and
# Azure's brings fewer crates than S3's (AWS's SDK and a DynamoDB lock client).
CARGO_TARGET_DIR="$cache/target" cargo build --release --features azure --manifest-path "$source/Cargo.toml"
install -D "$cache/target/release/kafka-delta-ingest" "$binary"
echo "kafka-delta-ingest: $binary"
