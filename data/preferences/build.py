#!/usr/bin/env python3
"""Builds preference pairs for the reward model and DPO from the instruction set (data/instructions/build.py,
itself from the Debian packages dict-gcide and debian-faq). Each pair's chosen answer is the entry's true
answer; its rejected answer is of a named kind:
  - other:    another entry's answer (from the same split);
  - shuffled: the true answer with its words shuffled;
  - cut:      the true answer cut mid-sentence;
  - loop:     the answer's opening phrase looping, the failure a small model's greedy answers show.
Pairs keep the split of their source entry (the instruction set splits by source entry), so no prompt or
true answer is in both splits. summary.json counts the pairs by kind and gives a word-overlap baseline's
accuracy per kind (the answer sharing more distinct words with the prompt wins; a tie counts one half).
Deterministic for a seed. Standard library only.

Usage: data/preferences/build.py OUT_DIR [--instructions data/instructions/out] [--pairs-per-entry 1] [--seed 0]
"""
import argparse
import json
import pathlib
import random
import re

KINDS = ["other", "shuffled", "cut", "loop"]
WORD = re.compile(r"[A-Za-z0-9']+")


def words(text):
    return {w.lower() for w in WORD.findall(text)}


def rejected(kind, answer, others, rng):
    tokens = answer.split()
    if kind == "other":
        while True:
            other = rng.choice(others)
            if other != answer:
                return other
    if kind == "shuffled":
        if len(set(tokens)) < 3:
            return None
        shuffled = tokens[:]
        while shuffled == tokens:
            rng.shuffle(shuffled)
        return " ".join(shuffled)
    if kind == "cut":
        if len(tokens) < 4:
            return None
        keep = rng.randint(max(1, len(tokens) * 3 // 10), max(1, len(tokens) * 7 // 10))
        return " ".join(tokens[:keep]).rstrip(".,;:")
    if kind == "loop":
        phrase = " ".join(tokens[:rng.randint(2, 4)]).rstrip(".,;:")
        repeats = max(3, (len(tokens) * 2) // max(1, len(phrase.split())))
        return ". ".join([phrase] * repeats) + "."
    raise ValueError(kind)


def overlap_score(prompt, answer):
    a = words(answer)
    return len(a & words(prompt)) / max(1, len(a))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--instructions", default="data/instructions/out")
    parser.add_argument("--pairs-per-entry", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"kinds": KINDS, "pairs": {}, "overlap_baseline_accuracy": {}}
    for split in ("train", "val"):
        source = pathlib.Path(args.instructions) / f"{split}.jsonl"
        entries = [json.loads(line) for line in source.open(encoding="utf-8")]
        entries = [e for e in entries if "prompt" in e and "response" in e]
        answers = [e["response"] for e in entries]
        rng = random.Random(f"{args.seed}:{split}")
        counts = {k: 0 for k in KINDS}
        right = {k: 0.0 for k in KINDS}
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for i, entry in enumerate(entries):
                for p in range(args.pairs_per_entry):
                    kind = KINDS[(i * args.pairs_per_entry + p) % len(KINDS)]
                    bad = rejected(kind, entry["response"], answers, rng)
                    if bad is None or bad == entry["response"]:
                        continue
                    pair = {"prompt": entry["prompt"], "chosen": entry["response"], "rejected": bad, "kind": kind}
                    f.write(json.dumps(pair, ensure_ascii=False) + "\n")
                    counts[kind] += 1
                    good_score, bad_score = overlap_score(entry["prompt"], entry["response"]), overlap_score(entry["prompt"], bad)
                    right[kind] += 1.0 if good_score > bad_score else 0.5 if good_score == bad_score else 0.0
        summary["pairs"][split] = counts
        summary["overlap_baseline_accuracy"][split] = {k: right[k] / max(1, counts[k]) for k in KINDS}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
