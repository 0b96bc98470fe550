#!/usr/bin/env bash
# A full disk during a save: the job's out_dir on a 2,600 kB tmpfs (in a mount namespace of its own, so
# nothing outside the test sees it) that holds the step-20 checkpoint (1.6 MB) but not the step-40 one.
# The save must fail naming the file and the cause, every rank exit non-zero, the step-20 checkpoint
# stay complete and `latest` keep naming it. With room made, the rerun removes the half-written
# folder, resumes from step 20, and its 60 losses equal the uninterrupted job's bit for bit.
# In a user and mount namespace of its own (no root needed); fails, never skips, where none can be made.
# usage: full_disk_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1
build=$2
work=$3
source "$src/tests/dist/job_common.sh"
make_job 60 20
run_one_host "$work/reference"
mkdir -p "$work/disk"
unshare --user --map-root-user --mount true 2>/dev/null ||
  fail "cannot make a user and mount namespace (unprivileged user namespaces are off: sysctl user.max_user_namespaces)"
export src build work
unshare --user --map-root-user --mount --propagation private bash -euo pipefail -c '
source "$src/tests/dist/job_common.sh"
mount -t tmpfs -o size=2600k kuafu-full-disk "$work/disk"
job=$work/disk/run
if timeout 300 "$run" --nproc-per-node 4 --master-port 0 "$gpt" train --config "$work/config.toml" --set train.out_dir=\""$job"\" \
    >"$work/full.log" 2>&1; then fail "the job on a full disk exited 0"; else code=$?; fi
((code != 124)) || fail "the job on a full disk hung"
echo "on a full disk: kuafu-run exited with $code"
grep "No space left on device" "$work/full.log" | head -1
grep -q "cannot write $job/checkpoints/step_00000040.partial/.*No space left on device" "$work/full.log" ||
  fail "the error names no file: $(grep error "$work/full.log" | head -3)"
[[ $(cat "$job/checkpoints/latest") == step_00000020 && -f $job/checkpoints/step_00000020/manifest.json ]] ||
  fail "the last complete checkpoint is gone or latest moved: $(ls "$job/checkpoints")"
mount -t tmpfs -o remount,size=20m kuafu-full-disk "$work/disk"
timeout 300 "$run" --nproc-per-node 4 --master-port 0 "$gpt" train --config "$work/config.toml" --set train.out_dir=\""$job"\" \
  >"$work/resumed.log" 2>&1 || { tail -20 "$work/resumed.log"; fail "the rerun with room"; }
grep -h "partial\|resumed from" "$work/resumed.log"
[[ ! -e $job/checkpoints/step_00000040.partial ]] || fail "the half-written checkpoint is still there"
grep -q "resumed from $job/checkpoints/step_00000020 at step 20" "$work/resumed.log" || fail "did not resume from step 20"
[[ $(losses "$job") == $(losses "$work/reference") && $(losses "$job" | wc -l) == 60 ]] ||
  fail "the losses after the full disk differ: $(diff <(losses "$work/reference") <(losses "$job") | head)"
echo "after a full disk and a resume: the 60 losses equal the uninterrupted job'"'"'s, bit for bit"
'
