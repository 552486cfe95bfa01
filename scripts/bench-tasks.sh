#!/usr/bin/env bash
# Tasks against the device's limit (docs/BENCHMARKS.md, "Tasks"): fio's random 4 KiB reads at
# queue depth 64 on the data file, then YCSB-C on 20M records (1 GiB cache) with 2 workers x
# 64 tasks, 32 plain workers and 2 plain workers, alternating, ROUNDS times.
#
#   scripts/bench-tasks.sh [DIR] [ROUNDS]
#
# DIR (default ./shoal-bench-tasks) holds the table (loaded once, about 3.4 GB) and the
# results (one JSON per run, fio's output). Installs fio with apt-get if it is missing.
set -euo pipefail
dir=${1:-./shoal-bench-tasks}
rounds=${2:-3}
records=${RECORDS:-20000000}
shoal=${SHOAL:-target/release/shoal}
[ -x "$shoal" ] || cargo build --release -p shoal-tools
if ! command -v fio >/dev/null; then
    apt-get install -y fio >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y fio >/dev/null; }
fi
mkdir -p "$dir/results"
data="$dir/table"
if [ ! -f "$data/ycsb-dataset.json" ]; then
    rm -rf "$data"
    "$shoal" ycsb load --records "$records" --value-size 120 --cache 1GiB --workers 2 --data-dir "$data"
fi
file=$(ls -S "$data"/node0-*.dat | head -1)
run() { # name, extra args
    local name=$1
    shift
    "$shoal" ycsb run --workload c --distribution uniform --cache 1GiB --data-dir "$data" \
        --warmup 10 --duration 10 --quiet --json "$dir/results/$name-$r.json" "$@" |
        grep -E "throughput|latency|nvme reads" | sed "s/^/$name: /"
}
for r in $(seq 1 "$rounds"); do
    echo "== round $r ($(date -u +%FT%TZ))"
    fio --name=qd64 --filename="$file" --readonly --rw=randread --bs=4k --direct=1 \
        --ioengine=io_uring --iodepth=64 --runtime=10 --time_based --output-format=json \
        >"$dir/results/fio-qd64-$r.json"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('fio qd64: %.0f reads/s' % j['jobs'][0]['read']['iops'])" \
        "$dir/results/fio-qd64-$r.json"
    run tasks-2x64 --workers 2 --tasks 64
    run threads-32 --workers 32
    run threads-2 --workers 2
done
