# What the chat demos share (sourced by demo.sh and demo_rlvr.sh): the programs they need, each step's
# seconds, and --set of a string key.
python=.venv/bin/python
[[ -x $python ]] || { echo "$python not found: run scripts/setup" >&2; exit 1; }
for program in "$@"; do
  [[ -x $program ]] || { echo "$program not found: build first (scripts/build)" >&2; exit 1; }
done
declare -A seconds
timed() {  # name command...: runs the command, adding its seconds to seconds[name]
  local t0; t0=$(date +%s)
  "${@:2}"
  seconds[$1]=$(( ${seconds[$1]:-0} + $(date +%s) - t0 ))
}
at() { echo "--set" "$1=\"$2\""; }  # key value: a string key set on the command line
