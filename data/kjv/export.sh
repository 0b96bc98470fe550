#!/usr/bin/env bash
# Exports the King James Bible (Debian package bible-kjv) to OUT_DIR/kjv.txt as plain text:
# one verse per line without its number, "Book N" heading lines, a blank line between chapters.
# Usage: data/kjv/export.sh [--force] OUT_DIR
set -euo pipefail

usage() { echo "usage: $0 [--force] OUT_DIR" >&2; exit 2; }

force=0
out_dir=""
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) usage ;;
    -*) echo "error: unknown option $arg" >&2; usage ;;
    *) [[ -z "$out_dir" ]] || usage; out_dir="$arg" ;;
  esac
done
[[ -n "$out_dir" ]] || usage

out="$out_dir/kjv.txt"
if [[ -s "$out" && "$force" -eq 0 ]]; then
  echo "$out already exists; skipping (use --force to re-export)"
  exit 0
fi

if ! command -v bible >/dev/null 2>&1; then
  echo "error: the 'bible' command is not installed; install the Debian package bible-kjv" \
       "(apt-get install bible-kjv)" >&2
  exit 1
fi

mkdir -p "$out_dir"
tmp="$out.tmp"
trap 'rm -f "$tmp"' EXIT

# bible prints, per chapter: a blank line, the heading ("Genesis 1", "1 Samuel 3"), a blank line,
# then verses as "  N text" hard-wrapped at 80 columns, continuation lines unindented.
# The awk below joins each verse's lines, drops the number and squeezes repeated spaces; a heading
# is a non-verse line right after a blank one.
bible 'Gen1:1-Rev22:21' | awk '
  function flush() {
    if (verse == "") return
    gsub(/  +/, " ", verse); sub(/ +$/, "", verse)  # a few stray double and trailing spaces upstream
    print verse; verses++; verse = ""
  }
  /^$/ { flush(); after_blank = 1; next }
  /^  [0-9]+ / { flush(); verse = $0; sub(/^  [0-9]+ /, "", verse); after_blank = 0; next }
  after_blank {
    if (chapters++ > 0) print ""
    print; after_blank = 0; next
  }
  { verse = verse " " $0 }
  END {
    flush()
    # A changed upstream format should fail loudly, not produce a subtly wrong corpus.
    if (verses != 31102 || chapters != 1189) {
      printf "error: expected 31102 verses in 1189 chapters from bible, got %d in %d\n", verses, chapters > "/dev/stderr"
      exit 1
    }
  }' > "$tmp"

mv "$tmp" "$out"
trap - EXIT
echo "wrote $out ($(wc -l < "$out") lines, $(wc -c < "$out") bytes)"
