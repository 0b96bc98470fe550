#!/usr/bin/env bash
# The bytes each rank really puts on the wire (every rank on its own namespaced host, its eth0 transmit
# counter: benchmarks/tensor_parallel_wire.sh) against what Kuafu's communication accounting counts:
# one GPT block under 1D and a lone all-gather, broadcast and all-reduce within 3% (Gloo's message
# headers and the TCP/IP headers the packet count leaves out), and a reduce-scatter at twice the
# accounted bytes, because Gloo (torch 2.11) runs it as an all-reduce whose slice it keeps
# (docs/tensor_parallel.md). Fails (never skips) where namespaces cannot be made.
# usage: wire_bytes_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1
build=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
LAYOUTS="1d 4 1;all_reduce 4;all_gather 4;broadcast 4;reduce_scatter 4" \
  "$src/benchmarks/tensor_parallel_wire.sh" "$build" "$work/wire.jsonl" --hidden 128 --heads 4 --batch 4 --seq 64
python3 - "$work/wire.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 5, rows
expected = {"1d": (1.0, 1.03), "all_reduce": (1.0, 1.03), "all_gather": (1.0, 1.03), "broadcast": (1.0, 1.03),
            "reduce_scatter": (1.95, 2.06)}
for row in rows:
    what = row.get("mode") or row["collective"]
    ratio = row["wire_payload_bytes_mean"] / row["formula_bytes"]
    low, high = expected[what]
    print(f"{what}: wire payload / accounted = {ratio:.4f} (expected {low} to {high})")
    assert low <= ratio <= high, f"{what}: {ratio} outside [{low}, {high}]"
PY
