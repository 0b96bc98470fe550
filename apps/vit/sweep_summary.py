"""The large-batch sweep's table and its accuracy-against-batch figure (apps/vit/large_batch_sweep.sh).

Reads every run folder <out>/<optimizer>_b<batch>_lr<rate> and writes
  <out>/summary.md            every rate tried, and the best rate per optimizer and batch;
  <out>/accuracy_vs_batch.{png,svg}
  <out>/accuracy.csv          every run's test accuracy and loss after each epoch;
  <out>/best_runs.txt         the folder of each (optimizer, batch)'s best rate, for scripts/report.
Final test accuracy is the last evaluation's (after the last epoch); an unfinished run is listed with
the epoch it reached and left out of the comparison.
With --beyond-edges it writes nothing and prints "optimizer batch rate" for the next rate to try
(twice the highest, or half the lowest) wherever the best of an optimizer and batch is at an edge of
the rates tried.
Usage: .venv/bin/python apps/vit/sweep_summary.py OUT [--beyond-edges]
"""

import os
import re
import sys
import tomllib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "python"))
import kuafu_report  # noqa: E402  (found through the path above)

NAME = re.compile(r"^(adamw|lamb)_b(\d+)_lr([0-9.e+-]+)$")
LABELS = {"adamw": "AdamW", "lamb": "LAMB"}


def read_runs(out):
    runs = []
    for name in sorted(os.listdir(out)):
        match = NAME.match(name)
        folder = os.path.join(out, name)
        if not match or not os.path.isfile(os.path.join(folder, "metrics.jsonl")):
            continue
        run = kuafu_report.load_run(folder)
        accuracy = [row for row in run.eval_rows if kuafu_report.is_number(row.get("val_accuracy"))]
        if not accuracy:
            continue
        wall = os.path.join(folder, "wall_seconds")
        number = lambda row, key: row[key] if kuafu_report.is_number(row.get(key)) else float("nan")
        curve = [(number(row, "epoch"), row["val_accuracy"], number(row, "val_loss")) for row in accuracy]
        runs.append({
            "name": name, "folder": folder, "optimizer": match.group(1), "batch": int(match.group(2)),
            "lr": float(match.group(3)), "lr_text": match.group(3),
            "done": os.path.exists(os.path.join(folder, "done")),
            "epoch": number(accuracy[-1], "epoch"), "final": 100 * accuracy[-1]["val_accuracy"],
            "best": 100 * max(row["val_accuracy"] for row in accuracy),
            "steps": max((row["step"] for row in run.train_rows), default=0),
            "minutes": sum(float(x) for x in open(wall).read().split()) / 60 if os.path.exists(wall) else None,
            "warmup": warmup_steps(run.config_text), "curve": curve,
        })
    return runs


def warmup_steps(config_text):
    """The run's optim.warmup_steps; None when its config is missing or unreadable (the table shows it)."""
    try:
        return tomllib.loads(config_text)["optim"]["warmup_steps"] if config_text else None
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        return None


def best_per_setting(runs):
    """(optimizer, batch) -> the finished run with the highest final accuracy."""
    best = {}
    for run in runs:
        if not run["done"]:
            continue
        key = (run["optimizer"], run["batch"])
        if key not in best or run["final"] > best[key]["final"]:
            best[key] = run
    return best


def write_table(runs, best, out):
    lines = ["| optimizer | batch | steps | peak lr | warm-up steps | final test accuracy | best epoch's | wall time |",
             "|---|---|---|---|---|---|---|---|"]
    for run in sorted(runs, key=lambda r: (r["batch"], r["optimizer"], r["lr"])):
        chosen = best.get((run["optimizer"], run["batch"])) is run
        final = f"{run['final']:.2f}%" if run["done"] else f"{run['final']:.2f}% (epoch {run['epoch']:g}, unfinished)"
        if chosen:
            final = f"**{final}**"
        minutes = f"{run['minutes']:.1f} min" if run["minutes"] is not None else "-"
        lines.append(f"| {LABELS[run['optimizer']]} | {run['batch']:,} | {run['steps']:,} | {run['lr_text']} | "
                     f"{run['warmup']} | {final} | {run['best']:.2f}% | {minutes} |")
    lines += ["", "Best rate per optimizer and batch (final test accuracy):", "",
              "| batch | AdamW | LAMB | LAMB − AdamW |", "|---|---|---|---|"]
    for batch in sorted({b for _, b in best}):
        adamw, lamb = best.get(("adamw", batch)), best.get(("lamb", batch))
        cell = lambda r: f"{r['final']:.2f}% (lr {r['lr_text']})" if r else "-"
        gap = f"{lamb['final'] - adamw['final']:+.2f}" if adamw and lamb else "-"
        lines.append(f"| {batch:,} | {cell(adamw)} | {cell(lamb)} | {gap} |")
    baseline = best.get(("adamw", 128))
    if baseline:
        lines += ["", f"Baseline (AdamW, batch 128): {baseline['final']:.2f}%."]
        lamb = best.get(("lamb", 1536))
        if lamb:
            gap = lamb["final"] - baseline["final"]
            lines.append(f"LAMB at 1,536 is {gap:+.2f} points from it (target: within 1).")
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def plot(runs, best, out):
    plt = kuafu_report.plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"adamw": "#1f77b4", "lamb": "#d62728"}
    for optimizer in ("adamw", "lamb"):
        tried = [r for r in runs if r["optimizer"] == optimizer and r["done"]]
        ax.scatter([r["batch"] for r in tried], [r["final"] for r in tried], s=14, alpha=0.35,
                   color=colours[optimizer], label=f"{LABELS[optimizer]}, every rate tried")
        chosen = sorted((b, r["final"]) for (o, b), r in best.items() if o == optimizer)
        if chosen:
            (line,) = ax.plot([b for b, _ in chosen], [a for _, a in chosen], marker="o", linewidth=2,
                              color=colours[optimizer], label=f"{LABELS[optimizer]}, best rate")
            line.set_gid(f"best-{optimizer}")
    baseline = best.get(("adamw", 128))
    if baseline:
        ax.axhline(baseline["final"] - 1, color="gray", linestyle="--", linewidth=1,
                   label=f"baseline − 1 point ({baseline['final'] - 1:.2f}%)")
    finals = [r["final"] for r in best.values()]
    low = min(finals) - 5  # diverged rates would squash the comparison: they stay in the table
    if any(r["done"] and r["final"] < low for r in runs):
        ax.set_ylim(low, max(finals) + 1.5)
        ax.text(0.99, 0.02, f"rates that ended below {low:.0f}% are off the scale (see summary.md)",
                transform=ax.transAxes, ha="right", fontsize=7, color="gray")
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in runs})
    ax.set_xticks(batches, [f"{b:,}" for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size (images per step; Fashion-MNIST has 60,000)")
    ax.set_ylabel("final test accuracy (%)")
    epochs = {round(r["epoch"]) for r in runs if r["done"]}
    ax.set_title(f"ViT on Fashion-MNIST, {'/'.join(map(str, sorted(epochs)))} epochs at every batch", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    for fmt in ("png", "svg"):
        fig.savefig(os.path.join(out, f"accuracy_vs_batch.{fmt}"), format=fmt, metadata=kuafu_report.FILE_METADATA[fmt])
    plt.close(fig)


def beyond_edges(runs, best):
    """The next rate for each (optimizer, batch) whose best finished rate is the highest or the lowest
    tried; a setting with an unfinished run waits for it. Smallest large batch first (the comparison
    with the baseline), the baseline's own last (its runs take longest)."""
    proposals = []
    order = lambda item: (item[0][1] == 128, item[0][1], item[0][0])  # noqa: E731
    for (optimizer, batch), chosen in sorted(best.items(), key=order):
        tried = [r for r in runs if r["optimizer"] == optimizer and r["batch"] == batch]
        if not all(r["done"] for r in tried):
            continue
        rates = [r["lr"] for r in tried]
        if chosen["lr"] == max(rates):
            proposals.append(f"{optimizer} {batch} {max(rates) * 2:.3g}")
        if chosen["lr"] == min(rates):
            proposals.append(f"{optimizer} {batch} {min(rates) / 2:.3g}")
    return proposals


def main():
    args = sys.argv[1:]
    edges = "--beyond-edges" in args
    args = [a for a in args if a != "--beyond-edges"]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = args[0]
    try:
        runs = read_runs(out) if os.path.isdir(out) else []
    except kuafu_report.ReportError as e:
        print(f"sweep_summary: {e}", file=sys.stderr)
        return 1
    if not runs:
        print(f"sweep_summary: {out} holds no evaluated runs named <optimizer>_b<batch>_lr<rate>", file=sys.stderr)
        return 1
    best = best_per_setting(runs)
    if edges:
        for proposal in beyond_edges(runs, best):
            print(proposal)
        return 0
    print(write_table(runs, best, out))
    plot(runs, best, out)
    with open(os.path.join(out, "accuracy.csv"), "w", encoding="utf-8") as f:
        f.write("run,epoch,test_accuracy,test_loss\n")
        for run in runs:
            for epoch, accuracy, loss in run["curve"]:
                f.write(f"{run['name']},{epoch:g},{accuracy:.4f},{loss:.4f}\n")
    order = sorted(best.values(), key=lambda r: (r["batch"], r["optimizer"]))
    with open(os.path.join(out, "best_runs.txt"), "w", encoding="utf-8") as f:
        f.write("".join(r["folder"] + "\n" for r in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
