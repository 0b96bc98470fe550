"""Figures and an HTML page from the metrics.jsonl of one or several training runs (scripts/report).

A run is a folder that a Kuafu app trained in (train.out_dir: metrics.jsonl, and config.toml beside it),
or a metrics.jsonl file itself. Training rows hold loss, lr, grad_norm, <items>_per_s, peak_mem_mb (and
"epoch" where the app has epochs); evaluation rows hold val_* keys. Every figure overlays the runs, one
line each (its SVG element id is run-<index>), against step or epoch.
"""

import argparse
import html
import json
import math
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import matplotlib.ticker  # noqa: E402

# Files that differ only when the data does: no dates, fixed SVG ids, text kept as text.
matplotlib.rcParams.update({"svg.hashsalt": "kuafu", "svg.fonttype": "none", "figure.dpi": 100})
FILE_METADATA = {"svg": {"Date": None}, "png": {"Software": None}}


# Per-step figures of tasks beyond the trainer's own (core/train's RunTask::step_figures), in this order.
TASK_FIGURES = ("reward", "kl", "response_length", "eos_rate", "answer_f1", "clip_fraction", "approx_kl", "kl_coef")


class ReportError(Exception):
    """Bad input: the message names the file (and line) at fault."""


class Run:
    def __init__(self, label, folder, train_rows, eval_rows, config_text):
        self.label = label
        self.folder = folder
        self.train_rows = train_rows
        self.eval_rows = eval_rows
        self.config_text = config_text

    def has_epochs(self):
        return all("epoch" in row for row in self.train_rows + self.eval_rows)

    def series(self, key, x_key, rows=None):
        rows = self.train_rows if rows is None else rows
        # A value that is not a number (null where a figure was not measured) leaves a gap.
        points = [(row[x_key], row[key]) for row in rows if is_number(row.get(key)) and is_number(row.get(x_key))]
        return [p[0] for p in points], [p[1] for p in points]

    def throughput_key(self):
        keys = sorted({k for row in self.train_rows for k in row if k.endswith("_per_s")})
        return keys[0] if keys else None


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numbers(rows, key):
    """The rows' values of `key` that are numbers (a null, a figure not measured, is left out)."""
    return [row[key] for row in rows if is_number(row.get(key))]


def load_run(path, label=None):
    """Reads a run folder or a metrics.jsonl. A torn last line (a killed run) is dropped; any other
    unreadable line is an error naming the file and line."""
    metrics = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(metrics):
        raise ReportError(f"{path}: no metrics.jsonl (expected a run folder or a metrics.jsonl file)")
    folder = os.path.dirname(os.path.abspath(metrics))
    with open(metrics, "rb") as f:
        lines = f.read().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    train_rows, eval_rows = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))  # a UnicodeDecodeError is a ValueError
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("a row is a JSON object with an integer \"step\"")
        except ValueError as e:
            if number == len(lines):
                print(f"report: {metrics}:{number}: dropped a torn last line", file=sys.stderr)
                continue
            raise ReportError(f"{metrics}:{number}: not a metrics row ({e})") from None
        (eval_rows if any(k.startswith("val_") for k in row) else train_rows).append(row)
    if not train_rows and not eval_rows:
        raise ReportError(f"{metrics}: no metrics rows (has the run taken a step?)")
    return Run(label or os.path.basename(folder.rstrip("/")), folder, train_rows, eval_rows, read_config(folder))


def read_config(folder):
    """The run's effective config: config.toml beside metrics.jsonl, else the newest checkpoint's copy."""
    path = os.path.join(folder, "config.toml")
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:  # shown as text only
            return f.read()
    checkpoints = os.path.join(folder, "checkpoints")
    steps = sorted(d for d in os.listdir(checkpoints) if d.startswith("step_")) if os.path.isdir(checkpoints) else []
    for step in reversed(steps):
        try:
            with open(os.path.join(checkpoints, step, "trainer.json"), encoding="utf-8") as f:
                return json.load(f)["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def centred_mean(values, half):
    """Mean of values[i - half : i + half + 1] at each i (a shorter window at the ends): no lag."""
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(len(values)):
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def evaluation_keys(runs):
    """The val_* metrics any run reports, sorted."""
    return sorted({k for run in runs for row in run.eval_rows for k in row if k.startswith("val_")})


def figure_specs(runs):
    """(file stem, title, y label, key, rows, smoothed) for each quantity some run has."""
    specs = []

    def present(key, rows):
        return any(key in row for run in runs for row in getattr(run, rows))

    if present("loss", "train_rows"):
        specs.append(("loss", "training loss", "loss", "loss", "train_rows", True))
    # Figures a task logs each step (RLHF's rollouts: reward, KL per sequence, length, EOS rate, ...).
    for key in TASK_FIGURES:
        if present(key, "train_rows"):
            specs.append((key, "per step: " + key.replace("_", " "), key, key, "train_rows", True))
    eval_keys = evaluation_keys(runs)
    for key in eval_keys:
        label = key + (" (%)" if key.endswith("accuracy") else "")
        specs.append((key, "evaluation: " + key[4:], label, key, "eval_rows", False))
    if present("lr", "train_rows"):
        specs.append(("lr", "learning rate", "learning rate", "lr", "train_rows", False))
    if any(run.throughput_key() for run in runs):
        specs.append(("throughput", "throughput", None, "_per_s", "train_rows", True))
    if present("peak_mem_mb", "train_rows"):
        specs.append(("memory", "peak memory", "MiB", "peak_mem_mb", "train_rows", False))
    if present("grad_norm", "train_rows"):
        specs.append(("grad_norm", "gradient norm (before clipping)", "norm", "grad_norm", "train_rows", True))
    return specs


def plot(runs, x_key, spec, out_dir, formats):
    stem, title, y_label, key, rows_name, smoothed = spec
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    note = ""
    if key == "_per_s":  # images/s, tokens/s: one unit when the runs share it
        units = {run.throughput_key().replace("_per_s", "/s") for run in runs if run.throughput_key()}
        y_label = units.pop() if len(units) == 1 else "items/s (each run's own unit)"
    for index, run in enumerate(runs):
        run_key = run.throughput_key() if key == "_per_s" else key
        if run_key is None:
            continue
        xs, ys = run.series(run_key, x_key, getattr(run, rows_name))
        if not xs:
            continue
        if key.endswith("accuracy"):
            ys = [100 * y for y in ys]
        colour = f"C{index % 10}"
        if smoothed and len(ys) > 50:  # per-step values are noisy: each step faint, a moving mean on top
            ax.plot(xs, ys, color=colour, linewidth=0.6, alpha=0.25)
            ys = centred_mean(ys, min(100, len(ys) // 40))
            note = " (faint: each step; line: centred mean over 5% of the steps, at most 201)"
        style = {"marker": "o", "markersize": 3} if len(xs) <= 60 else {}
        (line,) = ax.plot(xs, ys, color=colour, label=run.label, linewidth=1.4, **style)
        line.set_gid(f"run-{index}")
    if key == "grad_norm" and all_positive(runs, key):  # spikes span decades
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_title(title + note, fontsize=11)
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    if len(runs) > 1:
        ax.legend(fontsize=7, ncol=2 if len(runs) > 8 else 1, loc="best")
    fig.tight_layout()
    paths = []
    for fmt in formats:
        path = os.path.join(out_dir, f"{stem}.{fmt}")
        fig.savefig(path, format=fmt, metadata=FILE_METADATA[fmt])
        paths.append(path)
    plt.close(fig)
    return paths


def all_positive(runs, key):
    return all(value > 0 for run in runs for value in numbers(run.train_rows, key))


def summary_rows(runs):
    """One row per run: steps, last loss, each evaluation metric's last and best, median throughput,
    peak memory and the summed step time."""
    eval_keys = evaluation_keys(runs)
    header = ["run", "steps", "last loss"]
    for key in eval_keys:
        header += [f"{key} (last)", f"{key} (best)"]
    header += ["median throughput", "peak memory (MiB)", "step time (min)"]
    rows = []
    for run in runs:
        steps = max(row["step"] for row in run.train_rows + run.eval_rows)
        losses = numbers(run.train_rows, "loss")
        row = [run.label, str(steps), f"{losses[-1]:.4g}" if losses else "-"]
        for key in eval_keys:
            values = numbers(run.eval_rows, key)
            best = (min if key.endswith("loss") or key.endswith("ppl") else max)(values) if values else None
            row += [format_metric(key, values[-1]) if values else "-", format_metric(key, best) if values else "-"]
        tkey = run.throughput_key()
        rates = numbers(run.train_rows, tkey) if tkey else []
        row.append(f"{statistics.median(rates):,.0f} {tkey.replace('_per_s', '/s')}" if rates else "-")
        memory = numbers(run.train_rows, "peak_mem_mb")
        row.append(f"{max(memory):,.0f}" if memory else "-")
        times = numbers(run.train_rows, "step_time_s")
        row.append(f"{sum(times) / 60:.1f}" if times else "-")
        rows.append(row)
    return header, rows


def format_metric(key, value):
    return f"{100 * value:.2f}%" if key.endswith("accuracy") else f"{value:.4g}"


def write_html(runs, figures, x_key, out_dir, title):
    header, rows = summary_rows(runs)
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%;margin:8px 0}"
        "pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(runs)} run(s), curves against {html.escape(x_key)}.</p>",
        "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>",
    ]
    for row in rows:
        parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    for path in figures:
        name = os.path.basename(path)
        parts.append(f'<div><img src="{html.escape(name)}" alt="{html.escape(name)}"></div>')
    parts.append("<h2>Configs</h2>")
    for run in runs:
        parts.append(f"<details><summary>{html.escape(run.label)} ({html.escape(run.folder)})</summary>")
        text = run.config_text if run.config_text is not None else "(no config.toml beside metrics.jsonl)"
        parts.append(f"<pre>{html.escape(text)}</pre></details>")
    parts.append("</body></html>")
    path = os.path.join(out_dir, "index.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")
    return path


def report(paths, out_dir, x="auto", labels=None, formats=("png", "svg"), title="Kuafu training report"):
    """Writes the figures and index.html for the runs at `paths`; returns the files written."""
    if labels is not None and len(labels) != len(paths):
        raise ReportError(f"--labels gives {len(labels)} label(s) for {len(paths)} run(s)")
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    if x == "auto":
        x = "epoch" if all(run.has_epochs() for run in runs) else "step"
    if x == "epoch":
        for run in runs:
            if not run.has_epochs():
                raise ReportError(f"{run.folder}: its metrics rows have no \"epoch\" (the app has no epochs); "
                                  "use --x step")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    figures = []
    for spec in figure_specs(runs):
        paths_written = plot(runs, x, spec, out_dir, formats)
        written += paths_written
        figures.append(paths_written[-1] if "svg" in formats else paths_written[0])
    written.append(write_html(runs, figures, x, out_dir, title))
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="scripts/report",
        description="Figures (PNG and SVG) and an HTML page from the metrics.jsonl of one or several runs.")
    parser.add_argument("runs", nargs="+", help="run folders (train.out_dir) or metrics.jsonl files")
    parser.add_argument("--out", required=True, help="folder for the figures and index.html")
    parser.add_argument("--x", choices=["auto", "step", "epoch"], default="auto",
                        help="horizontal axis (auto: epoch when every run has epochs)")
    parser.add_argument("--labels", help="comma-separated legend labels, one per run (default: folder names)")
    parser.add_argument("--title", default="Kuafu training report")
    args = parser.parse_args(argv)
    labels = args.labels.split(",") if args.labels else None
    try:
        written = report(args.runs, args.out, args.x, labels, title=args.title)
    except (ReportError, OSError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 1
    print(f"report: wrote {len(written)} files to {args.out} (open {os.path.join(args.out, 'index.html')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
