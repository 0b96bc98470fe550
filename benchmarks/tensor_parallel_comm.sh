#!/usr/bin/env bash
# Measured bytes per rank for one GPT block under 1D, 2D, 2.5D and 3D at P = 4 and 8 (one process per
# rank on this machine, over Gloo), each next to its closed form, then the closed forms at P = 4, 8,
# 64 and 512. Extra arguments (e.g. --hidden 2048 --batch 8) go to every run.
# Usage: benchmarks/tensor_parallel_comm.sh [build dir = build] [options...]
set -euo pipefail
build=${1:-build}
shift || true
bench="$build/benchmarks/tensor_parallel_comm"
run="$build/tools/kuafu-run"
for tool in "$bench" "$run"; do
  [[ -x $tool ]] || { echo "$tool not found: build first (cmake --build $build -j2)" >&2; exit 1; }
done
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
for layout in "1d 4 1" "2d 4 1" "1d 8 1" "2.5d 8 2" "3d 8 1"; do
  read -r mode ranks depth <<<"$layout"
  "$run" --nproc-per-node "$ranks" "$bench" --mode "$mode" --depth "$depth" "$@" | grep -v '^{'
done
"$bench" --table "$@"
