# A small GPT job for the fault and multi-host tests (source it after setting src, build and work): its
# data and config (2 data x 2 tensor-1D ranks, dropout on), running it on this host, and its losses.
gpt=$build/apps/gpt/kuafu-gpt
run=$build/tools/kuafu-run
fail() { echo "FAILED: $*" >&2; exit 1; }
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1

# make_job STEPS CHECKPOINT_INTERVAL: $work/config.toml and its prepared data; JOB_WIDTH (64 unless
# set) is the model's width, ASYNC_SAVE (false unless set) its train.async_save.
make_job() {
  rm -rf "$work"
  mkdir -p "$work"
  cat /usr/share/common-licenses/{GPL-3,GPL-2,Apache-2.0,GFDL-1.3,Artistic} >"$work/text.txt"
  cat >"$work/config.toml" <<TOML
[model]
n_layer = 2
n_head = 4
n_embd = ${JOB_WIDTH:-64}
n_positions = 32
dropout = 0.1
[data]
text = "$work/text.txt"
dir = "$work/data"
vocab_size = 512
val_every = 2
context = 32
[train]
steps = $1
batch_size = 16
micro_batch_size = 4
eval_interval = 0
checkpoint_interval = $2
keep_checkpoints = 10
async_save = ${ASYNC_SAVE:-false}
[runtime]
device = "cpu"
[parallel.tensor]
mode = "1d"
size = 2
TOML
  "$gpt" prepare --config "$work/config.toml" >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; fail "prepare"; }
}

# run_one_host OUT_DIR: the job as 4 ranks on this host, to its end (on a free port: tests run side by side).
run_one_host() {
  timeout 300 "$run" --nproc-per-node 4 --master-port 0 "$gpt" train --config "$work/config.toml" --set train.out_dir=\""$1"\" \
    >"$1.log" 2>&1 || { tail -20 "$1.log"; fail "the one-host job $1"; }
}

# losses OUT_DIR: "step loss" per step, the last row of each step (a resumed run repeats steps).
losses() {
  python3 -c '
import json, sys
last = {}
for line in open(sys.argv[1] + "/metrics.jsonl"):
    row = json.loads(line)
    if "loss" in row and "step" in row: last[row["step"]] = row["loss"]
for step in sorted(last): print(step, repr(last[step]))' "$1"
}
