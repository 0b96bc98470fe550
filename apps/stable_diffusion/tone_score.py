"""Scores the skin tones of generated emoji against the real images' tone palette (docs/stable_diffusion.md).

  tone_score.py DATA GRID CAPTIONS [--size S]
      DATA: the emoji recipe's root (DATA/train and DATA/held_out, as `kuafu-sd prepare` writes them);
      GRID: a PNG of generated images side by side (`kuafu-sd sample`), S px each, in the order of
      CAPTIONS (a text file, one caption per line, each "<emoji name>: <tone> skin tone").
  tone_score.py DATA --self-check [--size S]
      scores the real held-out images themselves (the measurement's ceiling; it should be 1.0)

For each caption the base emoji's five real tone images (resized to S) give its skin mask, the pixels
whose colour differs between the tones, and its palette, each tone's mean colour on the mask. A generated
image's tone is the palette entry nearest its own mean colour on the mask. Prints one JSON line: the
share whose tone is the prompted one (chance 0.2), and each caption's prompted and measured tone.
"""
import argparse
import json
import pathlib

import numpy as np
from PIL import Image

TONES = ["light", "medium-light", "medium", "medium-dark", "dark"]
MODIFIERS = ["1f3fb", "1f3fc", "1f3fd", "1f3fe", "1f3ff"]


def load(path, size):
    return np.asarray(Image.open(path).convert("RGB").resize((size, size), Image.BILINEAR), dtype=np.float64)


def captions_index(data):
    """caption -> (base folder, tone index) over both splits."""
    index = {}
    for txt in pathlib.Path(data).glob("*/*/*.txt"):
        stem = txt.stem  # emoji_u<base>_<modifier>
        tone = next((i for i, m in enumerate(MODIFIERS) if stem.endswith("_" + m)), None)
        if tone is not None:
            index[txt.read_text()] = (txt.parent.name, tone)
    return index


def palette(data, base, size):
    """The base's skin mask [S, S] and its five tones' mean colours [5, 3]."""
    images = []
    for m in MODIFIERS:
        found = list(pathlib.Path(data).glob(f"*/{base}/emoji_u{base}_{m}.png"))
        images.append(load(found[0], size))
    stack = np.stack(images)  # [5, S, S, 3]
    mask = stack.std(axis=0).max(axis=-1) > 20
    if not mask.any():
        raise SystemExit(f"{base}: its tones do not differ at {size} px")
    return mask, np.stack([image[mask].mean(axis=0) for image in images])


def measured_tone(image, mask, colours):
    return int(np.argmin(np.linalg.norm(colours - image[mask].mean(axis=0), axis=1)))


def score(data, pairs, size):
    index = captions_index(data)
    rows, right = [], 0
    for caption, image in pairs:
        if caption not in index:
            raise SystemExit(f"caption {caption!r} is not one of the recipe's toned emoji")
        base, tone = index[caption]
        mask, colours = palette(data, base, size)
        got = measured_tone(image, mask, colours)
        right += got == tone
        rows.append({"caption": caption, "prompted": TONES[tone], "measured": TONES[got]})
    return {"images": len(rows), "tone_accuracy": right / max(1, len(rows)), "chance": 0.2, "rows": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data")
    parser.add_argument("grid", nargs="?")
    parser.add_argument("captions", nargs="?")
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--self-check", action="store_true")
    args = parser.parse_args()
    if args.self_check:
        pairs = [(txt.read_text(), load(txt.with_suffix(".png"), args.size))
                 for txt in sorted(pathlib.Path(args.data).glob("held_out/*/*.txt"))]
    else:
        captions = [line for line in pathlib.Path(args.captions).read_text().splitlines() if line]
        grid = np.asarray(Image.open(args.grid).convert("RGB"), dtype=np.float64)
        if grid.shape[1] != len(captions) * grid.shape[0]:
            raise SystemExit(f"{args.grid} is {grid.shape[1]}x{grid.shape[0]}, not {len(captions)} square images side by side")
        side = grid.shape[0]
        pairs = [(c, np.asarray(Image.fromarray(grid[:, i * side:(i + 1) * side].astype(np.uint8)).resize((args.size, args.size), Image.BILINEAR),
                                dtype=np.float64)) for i, c in enumerate(captions)]
    print(json.dumps(score(args.data, pairs, args.size)))


if __name__ == "__main__":
    main()
