#!/usr/bin/env bash
# One pool (docs/BENCHMARKS.md, "One pool"): YCSB-C (zipfian 0.99, 4 workers per node) on
#   sym   2 nodes x 128 MiB, 1M records (about 200 MiB of pages): one pool, plain caches
#         (--no-one-pool), and one node with 128 MiB;
#   asym  2 nodes with 32 MiB and 512 MiB, 1M records: one pool, plain caches, and the small
#         node alone (32 MiB); the same with --access partitioned (each node's workers on its
#         own half of the keys: the large node's workers never read the small node's pages)
#         against the small node alone on 500K records (its half);
#   big   2 nodes x 128 MiB on 1.9M records (about 1.5x the cluster's DRAM), one pool, against
#         one node with the whole cluster's DRAM (256 MiB);
# alternating within each round, ROUNDS times. Prints a table (throughput, NVMe reads and
# writes per second and node after warm-up, remote fetches, reads served from a copy elsewhere)
# and keeps one JSON per run.
#
#   scripts/bench-one-pool.sh [DIR] [ROUNDS]
set -euo pipefail
dir=${1:-./shoal-bench-one-pool}
rounds=${2:-3}
duration=${DURATION:-5}
shoal=${SHOAL:-target/release/shoal}
[ -x "$shoal" ] || cargo build --release -p shoal-tools
mkdir -p "$dir"
run() { # name, args
    local name=$1
    shift
    "$shoal" ycsb --workload c --workers 4 --duration "$duration" --quiet \
        --json "$dir/$name-$r.json" "$@" >/dev/null
}
for r in $(seq 1 "$rounds"); do
    echo "== round $r ($(date -u +%FT%TZ))" >&2
    run sym-pool --nodes 2 --records 1000000 --cache 128MiB
    run sym-plain --nodes 2 --records 1000000 --cache 128MiB --no-one-pool
    run sym-one --nodes 1 --records 1000000 --cache 128MiB
    run asym-pool --nodes 2 --records 1000000 --cache 32MiB,512MiB
    run asym-plain --nodes 2 --records 1000000 --cache 32MiB,512MiB --no-one-pool
    run asym-small --nodes 1 --records 1000000 --cache 32MiB
    run part-pool --nodes 2 --records 1000000 --cache 32MiB,512MiB --access partitioned
    run part-plain --nodes 2 --records 1000000 --cache 32MiB,512MiB --access partitioned --no-one-pool
    run part-small --nodes 1 --records 500000 --cache 32MiB
    run big-pool --nodes 2 --records 1900000 --cache 128MiB
    run big-one --nodes 1 --records 1900000 --cache 256MiB
done
python3 - "$dir" <<'EOF'
import json, glob, os, sys, statistics
d = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    name = os.path.basename(f).rsplit("-", 1)[0]
    j = json.load(open(f))
    s = j["duration_s"]
    nodes = j["per_node"]
    rows.setdefault(name, []).append((
        j["throughput_ops_per_s"],
        [n["throughput_ops_per_s"] for n in nodes],
        [n["nvme_reads"] / s for n in nodes],
        [n["nvme_writes"] / s for n in nodes],
        [n["remote_fetches"] / s for n in nodes],
        [n.get("nvme_reads_avoided", 0) / s for n in nodes],
        [n.get("pages_given_away", 0) / s for n in nodes],
    ))
fmt = lambda v: "/".join("%.0f" % x for x in v)
print("%-11s %4s %12s %18s %14s %12s %14s %14s %12s" % ("run", "n", "median ops/s", "ops/s per node", "nvme r/s", "nvme w/s", "remote/s", "avoided r/s", "given/s"))
for name, rs in rows.items():
    med = statistics.median(r[0] for r in rs)
    mid = sorted(rs, key=lambda r: r[0])[len(rs) // 2]
    print("%-11s %4d %12.0f %18s %14s %12s %14s %14s %12s" % (name, len(rs), med, fmt(mid[1]), fmt(mid[2]), fmt(mid[3]), fmt(mid[4]), fmt(mid[5]), fmt(mid[6])))
print("(per-node columns: the run with the median throughput; node 0 first)")
EOF
