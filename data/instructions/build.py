#!/usr/bin/env python3
"""Builds an instruction set from two Debian packages, for OPT fine-tuning (issue 19):
  - dict-gcide: each headword's first definition as {"prompt": "What does WORD mean?", "response": ...};
  - debian-faq: each question of the Debian FAQ with the first paragraph of its answer.
Pairs go to train.jsonl or val.jsonl by a hash of their source (GCIDE: the definition, which the
headwords of one entry and words defined alike share; the FAQ: the question), so no answer is in both.
pretrain.txt is plain text for pre-training a small model first: the training pairs as prose
("Harbinger: A forerunner.") and, with --kjv, the King James Bible; nothing of validation is in it.
Standard library only.

Usage: data/instructions/build.py OUT_DIR [--val-percent 10] [--gcide PATH] [--faq PATH] [--kjv PATH]
"""
import argparse
import gzip
import hashlib
import json
import pathlib
import re
import sys

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
HEADWORD = re.compile(r"^[A-Za-z][A-Za-z-]*[a-z]$")  # plain words: no abbreviations, numbers or phrases
NUMBERED = re.compile(r"^\s{2,}(?:\d+\.|\(a\))\s+(.*)$")
CITATION = re.compile(r"\s*--[A-Z].*$")  # "--Bacon.", "--Sir T. Browne." after a definition
RELATED = re.compile(r"\s*--\s[^-]*[\"*\\].*$")  # "-- Mem\"o*ra*ble*ness, n.": a related word's header
DOMAIN = re.compile(r"^\((?:[A-Z][a-z]*\.\s*)+\)\s*")  # "(Zool.)", "(Bot.)"
# What a header leaves when it wraps without a backslash: "(-s[i^]z). [L. abbatia, ...] The dignity".
LEADING_PRONUNCIATION = re.compile(r"^\((?=[^)]*[\"*\[])[^)]*\)[.,]?\s*")
LEADING_PART_OF_SPEECH = re.compile(r"^(?:(?:a|n|v|t|i|adv|prep|pl|p|pr|imp|conj|interj)\.\s*[;,]?\s*)+")
LEADING_ETYMOLOGY = re.compile(r"^\[[^\]]*\]\.?\s*")
# Pronunciation or etymology markup a wrapped header left behind ("(-l[imac])", "b[.a]`t[=e]", "S[imac],"):
# such a definition is dropped rather than guessed at.
MARKUP = re.compile(r"\[[a-z]*[\^=.`][a-z]*\]|\[(?:imac|amac|emac|omac|umac|aum|ecr|acir|ocir|ucir)\]|[*`\\]|\]")
TRAILING_NOTE = re.compile(r"\s*\[[^\]]*\]\.?\s*$")  # "[Written also Aum.]", "[Obs.]"
FAQ_HEADING = re.compile(r"^(\d+(?:\.\d+)+)\.\s+(.*)$")


def base64_number(text):
    value = 0
    for c in text:
        value = value * 64 + B64.index(c)
    return value


def clean(text):
    text = re.sub(r"\[(ae|oe|AE|OE)\]", r"\1", text)  # GCIDE's ligatures
    text = re.sub(r"[{}]", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    text = RELATED.sub("", CITATION.sub("", text))
    while TRAILING_NOTE.search(text):
        text = TRAILING_NOTE.sub("", text)
    previous = None
    while previous != text:
        previous = text
        for leading in (LEADING_PRONUNCIATION, LEADING_PART_OF_SPEECH, LEADING_ETYMOLOGY, DOMAIN):
            text = leading.sub("", text)
    return text.strip()


def first_definition(entry):
    """The first sense of a GCIDE entry, or None when it has no plain one."""
    lines = entry.splitlines()
    for i, line in enumerate(lines):
        numbered = NUMBERED.match(line)
        if numbered:
            body = [numbered.group(1)]
            for more in lines[i + 1:]:
                if not more.strip() or NUMBERED.match(more) or more.strip().startswith("["):
                    break
                body.append(more.strip())
            return clean(" ".join(body))
    # Unnumbered: the header (headword, pronunciation, part of speech, a bracketed etymology that may
    # wrap) then the definition, up to the first blank line.
    depth, body = 0, []
    for index, line in enumerate(lines):
        if not line.strip() or (body and line.strip().startswith("[")):
            if body:
                break
            continue
        # Header lines: the first, an etymology's bracket still open, a pronunciation (\Al"lo*cate\).
        if index == 0 or depth > 0 or "\\" in line:
            depth = max(0, depth + line.count("[") - line.count("]"))
            continue
        body.append(line.strip())
    return clean(" ".join(body)) if body else None


def gcide_pairs(path):
    data = gzip.open(path, "rb").read()
    index = pathlib.Path(path).with_suffix("").with_suffix(".index")
    seen = set()
    for line in index.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or not HEADWORD.match(parts[0]):
            continue
        word = parts[0].lower()
        if word in seen:
            continue
        start, length = base64_number(parts[1]), base64_number(parts[2])
        entry = data[start:start + length].decode("utf-8", errors="replace")
        definition = first_definition(entry)
        if not definition or not 12 <= len(definition) <= 300 or "\ufffd" in definition or MARKUP.search(definition):
            continue
        seen.add(word)
        response = definition[0].upper() + definition[1:]
        if not response.endswith("."):
            response += "."
        # Keyed by the definition: headwords of one entry, and words defined alike ("Same as ..."),
        # share an answer, so they share a side.
        yield response, {"prompt": f"What does {word} mean?", "response": response}


def faq_pairs(path):
    text = gzip.open(path, "rt", encoding="utf-8").read().replace("\u00a0", " ")  # no-break spaces
    start = text.find("Chapter 1.")  # after the table of contents
    if start < 0:
        sys.exit(f"error: {path} has no \"Chapter 1.\" after its table of contents (another FAQ layout?)")
    body = text[start:]
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        heading = FAQ_HEADING.match(lines[i])
        if not heading:
            i += 1
            continue
        question = [heading.group(2).strip()]
        i += 1
        while i < len(lines) and lines[i].strip() and not lines[i].startswith(" "):
            question.append(lines[i].strip())  # a wrapped heading
            i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        answer = []
        while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
            answer.append(lines[i].strip())
            i += 1
        question_text = " ".join(question)
        answer_text = " ".join(answer)
        if question_text.endswith("?") and 20 <= len(answer_text):
            yield question_text, {"prompt": question_text, "response": answer_text}


def prose(source, pair):
    """A training pair as plain text: "Word: definition" for GCIDE, the question then its answer for the FAQ."""
    if source == "gcide":
        word = pair["prompt"][len("What does "):-len(" mean?")]
        return f"{word[0].upper() + word[1:]}: {pair['response']}"
    return f"{pair['prompt']} {pair['response']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--val-percent", type=int, default=10)
    parser.add_argument("--gcide", default="/usr/share/dictd/gcide.dict.dz")
    parser.add_argument("--faq", default="/usr/share/doc/debian/FAQ/debian-faq.en.txt.gz")
    parser.add_argument("--kjv", help="kjv.txt (data/kjv/export.sh) to add to pretrain.txt")
    args = parser.parse_args()
    for path, package in ((args.gcide, "dict-gcide"), (args.faq, "debian-faq")):
        if not pathlib.Path(path).exists():
            sys.exit(f"error: {path} does not exist; install the Debian package {package} (scripts/setup)")
    out = pathlib.Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"train": 0, "val": 0, "gcide": 0, "faq": 0}
    with open(out / "train.jsonl.partial", "w", encoding="utf-8") as train, \
            open(out / "val.jsonl.partial", "w", encoding="utf-8") as val, \
            open(out / "pretrain.txt.partial", "w", encoding="utf-8") as pretrain:
        for source, pairs in (("gcide", gcide_pairs(args.gcide)), ("faq", faq_pairs(args.faq))):
            for key, pair in pairs:
                # By source: the same definition or question always lands on the same side.
                bucket = int(hashlib.sha1(f"{source}:{key}".encode()).hexdigest(), 16) % 100
                split = "val" if bucket < args.val_percent else "train"
                (val if split == "val" else train).write(json.dumps(pair, ensure_ascii=False) + "\n")
                if split == "train":
                    pretrain.write(prose(source, pair) + "\n")
                counts[split] += 1
                counts[source] += 1
        if args.kjv:
            pretrain.write(pathlib.Path(args.kjv).read_text(encoding="utf-8"))
    for name in ("train.jsonl", "val.jsonl", "pretrain.txt"):
        (out / f"{name}.partial").replace(out / name)
    (out / "summary.json").write_text(json.dumps(counts) + "\n")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
