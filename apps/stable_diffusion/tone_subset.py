"""The LoRA subset of the emoji demo (lora_subset.sh, docs/stable_diffusion.md): a subset whose captions do
not name what its images share.

  tone_subset.py DATA OUT
      DATA: the emoji recipe's root (DATA/train, DATA/held_out). The toned bases (those in all five skin
      tones), sorted, alternate between group a (even places) and group b. OUT/train and OUT/val: the
      dark-tone training images of group a's bases, each captioned with its base's name alone ("person
      running", not "person running: dark skin tone"). For each group g: OUT/prompts_g.txt, the bases'
      names, and OUT/dark_g.txt, the matching dark-tone captions (what tone_score.py measures against, so
      its tone_accuracy is the share of samples measured dark).
"""
import pathlib
import shutil
import sys

DARK = "1f3ff"
SUFFIX = ": dark skin tone"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    if out.exists():
        sys.exit(f"{out} already exists")
    darks = {}  # base -> the dark image's caption file
    for txt in data.glob(f"*/*/emoji_u*_{DARK}.txt"):
        if txt.read_text().endswith(SUFFIX):
            darks[txt.parent.name] = txt
    bases = sorted(darks)
    if len(bases) < 10:
        sys.exit(f"{data}: only {len(bases)} bases in a dark skin tone; run `kuafu-sd prepare` first")
    groups = {"a": bases[0::2], "b": bases[1::2]}
    for split in ("train", "val"):
        (out / split).mkdir(parents=True)
    copied = 0
    for base in groups["a"]:
        txt = darks[base]
        if txt.parent.parent.name != "train":
            continue  # this base's dark image is held out of the demo's training: not in the subset either
        name = txt.read_text()[: -len(SUFFIX)]
        for split in ("train", "val"):
            folder = out / split / base
            folder.mkdir()
            shutil.copy(txt.with_suffix(".png"), folder / txt.with_suffix(".png").name)
            (folder / txt.name).write_text(name)
        copied += 1
    for group, members in groups.items():
        captions = [darks[b].read_text() for b in members]
        (out / f"dark_{group}.txt").write_text("".join(c + "\n" for c in captions))
        (out / f"prompts_{group}.txt").write_text("".join(c[: -len(SUFFIX)] + "\n" for c in captions))
    print(f"{out}: {copied} dark-tone images of group a's {len(groups['a'])} bases, captioned by name; "
          f"{len(groups['b'])} bases in group b")


if __name__ == "__main__":
    main()
