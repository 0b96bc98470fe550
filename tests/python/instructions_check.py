"""Test of data/instructions/build.py (run by CTest): it builds the instruction set into a temporary
folder from the installed dict-gcide and debian-faq, and checks that no prompt and no answer is in
both splits (GCIDE defines many words alike: splitting by headword would leak thousands of answers),
that about the configured share is held out, that both sources contribute, and that a definition
worked out by hand from GCIDE's entry comes out clean. Exits non-zero on any failure."""
import json
import pathlib
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parents[2]
with tempfile.TemporaryDirectory() as out:
    subprocess.run([sys.executable, str(root / "data/instructions/build.py"), out, "--val-percent", "10"], check=True,
                   stdout=subprocess.DEVNULL)
    splits = {}
    for split in ("train", "val"):
        splits[split] = [json.loads(line) for line in open(pathlib.Path(out) / f"{split}.jsonl", encoding="utf-8")]
    summary = json.loads((pathlib.Path(out) / "summary.json").read_text())

failures = []
for field in ("prompt", "response"):
    in_train = {p[field] for p in splits["train"]}
    leaked = [p[field] for p in splits["val"] if p[field] in in_train]
    if leaked:
        failures.append(f"{len(leaked)} {field}s in both splits, e.g. {leaked[:3]}")
share = len(splits["val"]) / (len(splits["val"]) + len(splits["train"]))
if not 0.08 <= share <= 0.12:
    failures.append(f"validation share {share:.3f}, expected about 0.10")
if summary["gcide"] < 50000 or summary["faq"] < 100:
    failures.append(f"too few pairs: {summary}")
if any(not p["response"].strip() for split in splits.values() for p in split):
    failures.append("an empty response")
everything = {p["prompt"]: p["response"] for split in splits.values() for p in split}
# GCIDE's "Allocate": header, etymology in brackets over two lines, "1. To distribute or assign; to
# allot. --Burke." then "[1913 Webster]".
if everything.get("What does allocate mean?") != "To distribute or assign; to allot.":
    failures.append(f"allocate: {everything.get('What does allocate mean?')!r}")
if "What is Debian GNU/Linux?" not in everything:
    failures.append("the FAQ's 'What is Debian GNU/Linux?' is missing")
print(json.dumps({"train": len(splits["train"]), "val": len(splits["val"]), "failures": failures}))
sys.exit(1 if failures else 0)
