#!/usr/bin/env bash
# Faults in a two-host job (namespaced hosts, tests/dist/two_hosts_common.sh), each followed by a
# resume, the whole loss curve compared with the uninterrupted job's, bit for bit:
#   1. a rank on host 1 killed with SIGKILL after the step-20 checkpoint: every rank on both hosts
#      exits non-zero, within 15 s, and host 0's ranks name the group whose peer went away;
#   2. a rank on host 1 stopped with SIGSTOP (it hangs: no collective called, no socket closed) after
#      the step-40 checkpoint: the others' collectives time out (dist.timeout_s = 5), every rank exits
#      non-zero within 5 s + kuafu-run's 10 s grace + 10 s, naming the group;
#   3. the job resumed from the newest complete checkpoint runs to step 60.
# usage: faults_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
source "$1/scripts/netns_hosts.sh"
netns_hosts_isolate "$0" "$@"
src=$1
build=$2
work=$3
source "$src/tests/dist/two_hosts_common.sh"
make_job 60 20
run_one_host "$work/reference"

# wait_for_checkpoint OUT STEP: until OUT's checkpoint of STEP is complete (its manifest written last).
wait_for_checkpoint() {
  local manifest=$1/checkpoints/$(printf 'step_%08d' "$2")/manifest.json tries=0
  until [[ -f $manifest ]]; do
    ((++tries < 1200)) || fail "no checkpoint of step $2 in $1 after 60 s: $(tail -5 "$1.host0.log")"
    sleep 0.05
  done
}
# a_rank_on_host1: the pid of one of host 1's training processes.
a_rank_on_host1() {
  local pid
  for pid in $(ip netns pids "$hosts-1"); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == kuafu-gpt ]] && { echo "$pid"; return; }
  done
  fail "no kuafu-gpt process on host 1"
}
# expect_all_fail LABEL LIMIT_S: both hosts' kuafu-run exit non-zero within LIMIT_S of now.
expect_all_fail() {
  local label=$1 limit=$2 start=$SECONDS host code
  for host in 0 1; do
    if wait "${two_host_pids[$host]}"; then fail "$label: host $host exited 0"; else code=$?; fi
    ((code != 124)) || fail "$label: host $host hung until timeout killed it"
    echo "$label: host $host's kuafu-run exited with $code after $((SECONDS - start)) s"
  done
  ((SECONDS - start <= limit)) || fail "$label: the job took $((SECONDS - start)) s to end (limit $limit s)"
}

job=$work/faulted
start_two_hosts "$job" 29410
wait_for_checkpoint "$job" 20
kill -KILL "$(a_rank_on_host1)"
expect_all_fail "SIGKILL" 15
grep -E "communication failed in process group '[^']+' during" "$job.host0.log" | head -2
grep -qE "communication failed in process group" "$job.host0.log" || fail "host 0 named no group: $(tail -5 "$job.host0.log")"
mv "$job.host0.log" "$job.kill.host0.log"
mv "$job.host1.log" "$job.kill.host1.log"

start_two_hosts "$job" 29411 --set dist.timeout_s=5
wait_for_checkpoint "$job" 40
stopped=$(a_rank_on_host1)
kill -STOP "$stopped"
expect_all_fail "SIGSTOP (a hung rank)" $((5 + 10 + 10))
kill -KILL "$stopped" 2>/dev/null || true  # (kuafu-run has killed it already)
grep -E "communication failed in process group '[^']+' during" "$job.host0.log" | head -2
grep -qE "communication failed in process group .*timeout 5 s" "$job.host0.log" ||
  fail "host 0 named no group timing out: $(tail -5 "$job.host0.log")"

start_two_hosts "$job" 29412
for host in 0 1; do
  wait "${two_host_pids[$host]}" || { tail -20 "$job.host$host.log"; fail "the resumed job on host $host"; }
done
grep -h "resum" "$job.host0.log" | head -2
[[ $(losses "$job") == $(losses "$work/reference") && $(losses "$job" | wc -l) == 60 ]] ||
  fail "the loss curve after two faults and resumes differs from the uninterrupted one:
$(diff <(losses "$work/reference") <(losses "$job") | head -10)"
echo "after SIGKILL, a hang and two resumes: the 60 losses equal the uninterrupted job's, bit for bit"
