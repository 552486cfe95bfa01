#!/bin/bash
# Issue 29: the cost of sealed frames end to end. Alternating plain / sealed runs of the same
# 2-process tcp YCSB-C; prints "mode ops/s p50_us p99_us" per run.
# Usage: scripts/ab-encrypt.sh [pairs] (build first: cargo build --release -p shoal-tools)
set -euo pipefail
shoal=${SHOAL:-target/release/shoal}
pairs=${1:-4}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for _ in $(seq "$pairs"); do
  for mode in plain sealed; do
    flag=(); [ "$mode" = sealed ] && flag=(--encrypt)
    rm -rf "$dir/data"
    "$shoal" ycsb --nodes 2 --transport tcp "${flag[@]}" --workload c --records 1000000 \
      --cache 128MiB --workers 4 --duration 10 --data-dir "$dir/data" --json "$dir/run.json" \
      --quiet >/dev/null
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], round(d['throughput_ops_per_s']), d['p50_us'], d['p99_us'])" "$dir/run.json" "$mode"
  done
done
