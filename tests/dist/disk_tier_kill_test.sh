#!/usr/bin/env bash
# Gemini's disk tier through a killed rank (issue 55): two data-parallel ranks train with most master
# chunks (float32 masters, gradients, Adam state) in files under memory.disk_dir; one rank is killed with
# SIGKILL after the step-20 checkpoint, the job ends non-zero, and its scratch folders are left behind.
# The job resumed from the newest checkpoint (which the disk's files never replace: they are scratch)
# removes the dead run's folders, runs to step 40, and its 40 losses equal those of an uninterrupted job
# whose masters stay in host memory, bit for bit. At its clean end no scratch folder is left.
# usage: disk_tier_kill_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1
build=$2
work=$3
source "$src/tests/dist/job_common.sh"
make_job 40 10
# Gemini over the two data ranks, bf16 masters apart from the compute weights; every chunk's masters
# start in host memory, whose budget holds about half of them beside the compute shards and the disk
# tier's buffers.
gemini=(--set parallel.tensor.mode=\"none\" --set parallel.tensor.size=1 --set memory.strategy=\"gemini\" --set precision.dtype=\"bf16\"
        --set memory.offload_param_fraction=1 --set memory.offload_optim_fraction=1 --set memory.chunk_mb=0.03125)
disk=("${gemini[@]}" --set memory.host_budget_mb=1.5 --set memory.disk_dir=\""$work/disk"\")
mkdir -p "$work/disk"

# train OUT [ARGS...]: the job as 2 ranks on this host, in the background (pid in job_pid).
train() {
  local out=$1
  shift
  timeout 300 "$run" --nproc-per-node 2 --master-port 0 "$gpt" train --config "$work/config.toml" \
    --set train.out_dir=\""$out"\" "$@" >"$out.log" 2>&1 &
  job_pid=$!
}

train "$work/reference" "${gemini[@]}"
wait "$job_pid" || { tail -20 "$work/reference.log"; fail "the reference job"; }

job=$work/killed
train "$job" "${disk[@]}"
manifest=$job/checkpoints/step_00000020/manifest.json
for ((tries = 0; tries < 2400; ++tries)); do [[ -f $manifest ]] && break; sleep 0.05; done
[[ -f $manifest ]] || { tail -5 "$job.log"; fail "no checkpoint of step 20 after 120 s"; }
grep -m1 "on the disk tier" "$job.log" || fail "no master chunk went to the disk tier: $(grep -m1 Gemini "$job.log")"
rank=
for pid in $(pgrep -x kuafu-gpt); do  # a training rank (kuafu-run's own command line names kuafu-gpt too)
  grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null && { rank=$pid; break; }
done
[[ -n $rank ]] || fail "no training rank of $job to kill"
kill -KILL "$rank"
if wait "$job_pid"; then fail "the job exited 0 after a rank was killed"; fi
for pid in $(pgrep -x kuafu-gpt); do
  grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null && fail "rank $pid of the killed job still runs"
done
left=$(find "$work/disk" -mindepth 1 -maxdepth 1 -name 'kuafu-scratch-*' | wc -l)
echo "after SIGKILL: $left scratch folder(s) left in $work/disk"
((left >= 1)) || fail "the killed job left no scratch folder (were its masters on the disk?)"

train "$job" "${disk[@]}"
wait "$job_pid" || { tail -20 "$job.log"; fail "the resumed job"; }
grep -h "resumed from" "$job.log" | head -1
[[ $(losses "$job") == $(losses "$work/reference") && $(losses "$job" | wc -l) == 40 ]] ||
  fail "the losses after a killed rank and a resume on the disk tier differ from the uninterrupted job's:
$(diff <(losses "$work/reference") <(losses "$job") | head -10)"
left=$(find "$work/disk" -mindepth 1 | wc -l)
((left == 0)) || fail "$left entries left in $work/disk after the clean end: $(ls "$work/disk")"
echo "killed on the disk tier and resumed: the 40 losses equal the in-memory job's, bit for bit; no scratch left"
