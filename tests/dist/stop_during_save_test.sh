#!/usr/bin/env bash
# SIGTERM while a checkpoint is being written: a job of 4 ranks (the model 256 wide, so that a save takes
# long enough to be caught) gets SIGTERM through kuafu-run as soon as step 20's checkpoint folder
# exists only as step_00000020.partial. The save must finish and become `latest` (and not be written a
# second time when the run stops in step 21's micro-steps), every rank exit 143 (128 + SIGTERM), and
# the rerun resume from step 20 and reach step 40 with the uninterrupted job's losses, bit for bit.
# usage: stop_during_save_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1
build=$2
work=$3
source "$src/tests/dist/job_common.sh"
JOB_WIDTH=256 make_job 40 20
run_one_host "$work/reference"

job=$work/stopped
# kuafu-run itself in the background (not under `timeout`, which passes a SIGTERM it gets on to its
# child and then to its whole process group: kuafu-run takes a second SIGTERM as the order to kill the
# ranks), with a watchdog in timeout's place.
"$run" --nproc-per-node 4 --master-port 0 "$gpt" train --config "$work/config.toml" --set train.out_dir=\""$job"\" \
  >"$job.log" 2>&1 &
launcher=$!
(
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  sleep 300 &
  sleeper=$!
  wait "$sleeper"
  kill -KILL "$launcher"
) >/dev/null 2>&1 &
watchdog=$!
tries=0
until [[ -d $job/checkpoints/step_00000020.partial ]]; do
  ((++tries < 60000)) || fail "no save of step 20 began: $(tail -n 5 "$job.log")"
  kill -0 "$launcher" 2>/dev/null || fail "the job ended before its save of step 20: $(tail -n 5 "$job.log")"
  sleep 0.002
done
kill -TERM "$launcher"
[[ ! -f $job/checkpoints/step_00000020/manifest.json ]] || fail "the save had already finished: nothing was tested"
if wait "$launcher"; then code=0; else code=$?; fi
kill "$watchdog" 2>/dev/null || true
((code == 143)) || fail "SIGTERM during a save: kuafu-run exited with $code, not 143: $(tail -n 5 "$job.log")"
grep -h "stopped by signal\|saved checkpoint" "$job.log"
(($(grep -c "saved checkpoint" "$job.log") == 1)) || fail "the checkpoint of step 20 was written more than once"
latest=$(cat "$job/checkpoints/latest")
[[ $latest == step_00000020 && -f $job/checkpoints/step_00000020/manifest.json ]] ||
  fail "after SIGTERM during the step-20 save, latest is $latest: $(ls "$job/checkpoints")"
! ls -d "$job"/checkpoints/*.partial 2>/dev/null || fail "a .partial folder was left"

timeout 300 "$run" --nproc-per-node 4 --master-port 0 "$gpt" train --config "$work/config.toml" --set train.out_dir=\""$job"\" \
  >"$job.resumed.log" 2>&1 || { tail -20 "$job.resumed.log"; fail "the resumed job"; }
grep -q "resumed from $job/checkpoints/step_00000020 at step 20" "$job.resumed.log" || fail "did not resume from step 20"
[[ $(losses "$job") == $(losses "$work/reference") && $(losses "$job" | wc -l) == 40 ]] ||
  fail "the losses after the stop differ: $(diff <(losses "$work/reference") <(losses "$job") | head)"
echo "SIGTERM during a save: exit 143, the save completed once, and the 40 losses after the resume equal the uninterrupted job's, bit for bit"
