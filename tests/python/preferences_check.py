"""Test of data/preferences/build.py (run by CTest): it builds the instruction set (data/instructions/build.py,
from the installed dict-gcide and debian-faq) and the preference pairs into a temporary folder, and checks
that every pair's chosen answer is its entry's true answer and its rejected answer another of the named
kind (another entry's, the same words shuffled, a cut prefix, a looping phrase); that no prompt and no
true answer is in both splits; that every kind is present in each split; and that the word-overlap
baseline of summary.json is recomputed from the pairs. Exits non-zero on any failure."""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(root / "data/preferences"))
import build as recipe  # noqa: E402  (data/preferences/build.py, for its word-overlap score)

failures = []
with tempfile.TemporaryDirectory() as out:
    out = pathlib.Path(out)
    subprocess.run([sys.executable, str(root / "data/instructions/build.py"), str(out / "instructions"),
                    "--val-percent", "10"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, str(root / "data/preferences/build.py"), str(out / "pairs"),
                    "--instructions", str(out / "instructions")], check=True, stdout=subprocess.DEVNULL)
    truth = {}
    for split in ("train", "val"):
        for line in open(out / "instructions" / f"{split}.jsonl", encoding="utf-8"):
            e = json.loads(line)
            truth.setdefault(e["prompt"], set()).add(e["response"])
    pairs = {s: [json.loads(l) for l in open(out / "pairs" / f"{s}.jsonl", encoding="utf-8")] for s in ("train", "val")}
    summary = json.loads((out / "pairs" / "summary.json").read_text())

for split, rows in pairs.items():
    kinds = {p["kind"] for p in rows}
    if kinds != set(recipe.KINDS):
        failures.append(f"{split}: kinds {sorted(kinds)}")
    right = {k: 0.0 for k in recipe.KINDS}
    for p in rows:
        chosen, rejected, kind = p["chosen"], p["rejected"], p["kind"]
        if chosen not in truth.get(p["prompt"], ()):
            failures.append(f"{split}: chosen is not the true answer of {p['prompt']!r}")
        if rejected == chosen:
            failures.append(f"{split}: rejected equals chosen for {p['prompt']!r}")
        words = chosen.split()
        if kind == "shuffled" and sorted(rejected.split()) != sorted(words):
            failures.append(f"shuffled is not the same words: {p}")
        if kind == "cut" and not (chosen.startswith(rejected) and len(rejected) < len(chosen)):
            failures.append(f"cut is not a prefix: {p}")
        if kind == "loop" and len(re.findall(re.escape(rejected.split(".")[0] + "."), rejected)) < 3:
            failures.append(f"loop does not repeat a phrase: {p}")
        good, bad = recipe.overlap_score(p["prompt"], chosen), recipe.overlap_score(p["prompt"], rejected)
        right[kind] += 1.0 if good > bad else 0.5 if good == bad else 0.0
    for k in recipe.KINDS:
        n = summary["pairs"][split][k]
        if abs(right[k] / max(1, n) - summary["overlap_baseline_accuracy"][split][k]) > 1e-12:
            failures.append(f"{split} {k}: baseline {summary['overlap_baseline_accuracy'][split][k]} is not the pairs'")
for field in ("prompt", "chosen"):
    leaked = {p[field] for p in pairs["train"]} & {p[field] for p in pairs["val"]}
    if leaked:
        failures.append(f"{len(leaked)} {field}s in both splits, e.g. {sorted(leaked)[:3]}")
print(json.dumps({"train": len(pairs["train"]), "val": len(pairs["val"]), "failures": failures[:10]}))
sys.exit(1 if failures else 0)
