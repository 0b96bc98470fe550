"""Judges class-conditional Fashion-MNIST samples with a classifier trained apart (docs/stable_diffusion.md).

  fashion_score.py train CLASSIFIER.pt [--data DIR] [--epochs N]
      trains a small convolutional classifier with PyTorch on the real training images (Debian's
      dataset-fashion-mnist), prints its accuracy on the 10,000 real test images and fails below 90%.
  fashion_score.py score CLASSIFIER.pt GRID PROMPTS
      GRID: a PNG of generated 28 px images side by side (`kuafu-sd sample`), in the order of PROMPTS
      (a text file, one prompt per line, each one of configs/fashion_mnist.toml's class captions).
      Prints one JSON line: the share of images the classifier puts in the prompted class (chance 0.1),
      per class too.
  fashion_score.py grid GRID OUT.png [--rows R]
      the first R x 10 images of GRID as R rows of 10 (a class per column, as fashion_check.sh orders them).

The classifier shares no code with Kuafu: it is PyTorch alone, so it judges the samples independently.
"""
import argparse
import gzip
import json
import pathlib

import numpy as np
import torch
from PIL import Image

CLASSES = ["a t-shirt", "trousers", "a pullover", "a dress", "a coat", "a sandal", "a shirt", "a sneaker", "a bag",
           "an ankle boot"]  # configs/fashion_mnist.toml's data.class_captions, in label order
SIDE = 28


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_split(data, split):
    images = read_idx(pathlib.Path(data) / f"{split}-images-idx3-ubyte.gz")  # [N, 28, 28] uint8
    labels = read_idx(pathlib.Path(data) / f"{split}-labels-idx1-ubyte.gz")  # [N]
    return torch.from_numpy(images.copy()).float().div(255).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def classifier():
    # [B, 1, 28, 28] in [0, 1] -> logits [B, 10]
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.3), torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def predict(model, images):
    model.eval()
    with torch.no_grad():
        return torch.cat([model(chunk).argmax(dim=1) for chunk in images.split(1000)])


def train(args):
    torch.manual_seed(0)
    train_x, train_y = load_split(args.data, "train")
    test_x, test_y = load_split(args.data, "t10k")
    model = classifier()
    steps_per_epoch = len(train_x) // 128
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, 2e-3, total_steps=args.epochs * steps_per_epoch)
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(train_x))
        for step in range(steps_per_epoch):
            rows = order[step * 128:(step + 1) * 128]
            x = train_x[rows]
            flip = torch.rand(len(x)) < 0.5  # mirrored garments are garments
            x[flip] = x[flip].flip(-1)
            loss = torch.nn.functional.cross_entropy(model(x), train_y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
        accuracy = (predict(model, test_x) == test_y).float().mean().item()
        print(json.dumps({"epoch": epoch + 1, "test_accuracy": round(accuracy, 4)}), flush=True)
    torch.save(model.state_dict(), args.classifier)
    if accuracy < 0.9:
        raise SystemExit(f"the classifier reaches {accuracy:.4f} on the real test images, below the 0.9 it must")


def tiles(grid_path, count):
    grid = np.asarray(Image.open(grid_path).convert("L"), dtype=np.float32) / 255  # [28, 28 * count]
    if grid.shape != (SIDE, SIDE * count):
        raise SystemExit(f"{grid_path}: {grid.shape[1]}x{grid.shape[0]} px is not {count} images of {SIDE} px side by side")
    return torch.from_numpy(grid.reshape(SIDE, count, SIDE).transpose(1, 0, 2).copy()).unsqueeze(1)  # [count, 1, 28, 28]


def score(args):
    prompts = pathlib.Path(args.prompts).read_text().splitlines()
    unknown = sorted(set(prompts) - set(CLASSES))
    if unknown:
        raise SystemExit(f"{args.prompts}: prompts that are no class caption: {unknown[:3]}")
    wanted = torch.tensor([CLASSES.index(p) for p in prompts])
    model = classifier()
    model.load_state_dict(torch.load(args.classifier))
    right = predict(model, tiles(args.grid, len(prompts))) == wanted
    per_class = {CLASSES[c]: round(right[wanted == c].float().mean().item(), 4) for c in range(10) if (wanted == c).any()}
    print(json.dumps({"images": len(prompts), "class_accuracy": round(right.float().mean().item(), 4),
                      "per_class": per_class}))


def regrid(args):
    image = Image.open(args.grid).convert("L")
    columns = 10
    out = Image.new("L", (SIDE * columns, SIDE * args.rows))
    for i in range(args.rows * columns):
        tile = image.crop((i * SIDE, 0, (i + 1) * SIDE, SIDE))
        out.paste(tile, ((i % columns) * SIDE, (i // columns) * SIDE))
    out.save(args.out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    t = commands.add_parser("train")
    t.add_argument("classifier")
    t.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    t.add_argument("--epochs", type=int, default=4)
    s = commands.add_parser("score")
    s.add_argument("classifier")
    s.add_argument("grid")
    s.add_argument("prompts")
    g = commands.add_parser("grid")
    g.add_argument("grid")
    g.add_argument("out")
    g.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()
    {"train": train, "score": score, "grid": regrid}[args.command](args)


if __name__ == "__main__":
    main()
