# What the two-host tests share (source it after setting src, build and work; the test has called
# netns_hosts_isolate): two namespaced hosts (torn down on exit) and starting the job of job_common.sh
# on both. Fails, never skips, where namespaces cannot be made.
source "$src/tests/dist/job_common.sh"

hosts=kuafu-2h-$$
trap 'netns_hosts_down $hosts' EXIT
netns_hosts_up "$hosts" 2 || fail "the two hosts could not be made (network namespaces need root)"

# start_two_hosts OUT_DIR PORT [ARGS...]: starts the job on both hosts (RANKS_PER_HOST each, 2 unless
# set) in the background;
# their kuafu-run pids in two_host_pids, logs in OUT_DIR.host0.log and .host1.log. ARGS go to the app.
start_two_hosts() {
  local out=$1 port=$2 host
  shift 2
  two_host_pids=()
  for host in 0 1; do
    ip netns exec "$hosts-$host" timeout 300 "$run" --nnodes 2 --node-rank "$host" --nproc-per-node "${RANKS_PER_HOST:-2}" \
      --master-addr "$(netns_hosts_address 0)" --master-port "$port" \
      "$gpt" train --config "$work/config.toml" --set train.out_dir=\""$out"\" "$@" >"$out.host$host.log" 2>&1 &
    two_host_pids+=($!)
  done
}

