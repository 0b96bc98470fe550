"""The large-batch sweep and scripts/report on real runs: apps/vit/large_batch_sweep.sh trains AdamW and
LAMB at batch 8,192 for one epoch of Fashion-MNIST (7 steps each), then the report must draw each
quantity with one line per run, in PNG and SVG, and an HTML page with both runs' configs; a second
invocation must skip the finished runs; bad input must fail naming the file.
Usage: report_test.py SOURCE_DIR BUILD_DIR WORK_DIR   (exits non-zero on the first failure)
"""

import json
import os
import shutil
import subprocess
import sys

source, build, work = sys.argv[1:4]
sys.path.insert(0, os.path.join(source, "scripts", "python"))
import kuafu_report  # noqa: E402

RUNS = ["lamb_b8192_lr0.03", "adamw_b8192_lr0.008"]


def check(condition, message):
    if not condition:
        print("FAILED: " + message, file=sys.stderr)
        sys.exit(1)


def sweep():
    return subprocess.run([os.path.join(source, "apps", "vit", "large_batch_sweep.sh"), "--build", build, "--out",
                           out, "--epochs", "1", "--jobs", "2", "--only", " ".join(RUNS), "--set",
                           "runtime.threads=1"], capture_output=True, text=True)


shutil.rmtree(work, ignore_errors=True)
out = os.path.join(work, 'sweep "1" \\ b')  # quotes and a backslash reach train.out_dir as a TOML string
first = sweep()
check(first.returncode == 0, f"the sweep failed:\n{first.stdout}\n{first.stderr}")

# Each run trained its 7 steps, evaluated once, and recorded its epoch and config.
metrics = {}
for name in RUNS:
    folder = os.path.join(out, name)
    check(os.path.exists(os.path.join(folder, "done")), f"{name} is not marked done")
    rows = [json.loads(line) for line in open(os.path.join(folder, "metrics.jsonl"))]
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "val_accuracy" in r]
    check([r["step"] for r in train] == list(range(1, 8)), f"{name}: training rows {[r['step'] for r in train]}")
    check(abs(train[-1]["epoch"] - 1.0) < 1e-12 and abs(train[0]["epoch"] - 1 / 7) < 1e-12,
          f"{name}: epochs {train[0]['epoch']} .. {train[-1]['epoch']}, expected 1/7 .. 1")
    check(len(evals) == 1 and evals[0]["epoch"] == 1.0, f"{name}: evaluation rows {evals}")
    config = open(os.path.join(folder, "config.toml")).read()
    check(f'name = "{name.split("_")[0]}"' in config and "batch_size = 8192" in config,
          f"{name}: config.toml does not hold the run's optimizer and batch")
    metrics[name] = open(os.path.join(folder, "metrics.jsonl")).read()

# The summary lists both runs, each with its final accuracy, and draws accuracy against batch.
summary = open(os.path.join(out, "summary.md")).read()
for name in RUNS:
    accuracy = [json.loads(l) for l in metrics[name].splitlines() if "val_accuracy" in l][-1]["val_accuracy"]
    check(f"{100 * accuracy:.2f}%" in summary, f"summary.md lacks {name}'s accuracy {100 * accuracy:.2f}%")
for fmt in ("png", "svg"):
    check(os.path.getsize(os.path.join(out, f"accuracy_vs_batch.{fmt}")) > 1000, f"accuracy_vs_batch.{fmt} is empty")

# Every figure of both reports: PNG and SVG, non-empty, one line per run.
for report_dir in ("report", "report_all"):
    for stem in ("loss", "val_accuracy", "val_loss", "lr", "throughput", "memory", "grad_norm"):
        png = os.path.join(out, report_dir, stem + ".png")
        svg = os.path.join(out, report_dir, stem + ".svg")
        check(os.path.isfile(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(png) > 5000,
              f"{png} is missing or not a PNG")
        text = open(svg).read()
        lines = sorted(part.split('"')[0] for part in text.split('id="run-')[1:])
        check(lines == ["0", "1"], f"{svg}: run lines {lines}, expected one per run (0, 1)")
    page = open(os.path.join(out, report_dir, "index.html")).read()
    for name in RUNS:
        optimizer = name.split("_")[0]
        check(name in page and f"name = &quot;{optimizer}&quot;" in page, f"index.html lacks {name} or its config")
    check(page.count("<img ") == 7, f"index.html shows {page.count('<img ')} figures, expected 7")

# A second invocation skips both finished runs and leaves their metrics alone.
second = sweep()
check(second.returncode == 0 and all(f"{name}: done" in second.stdout for name in RUNS),
      f"the second sweep did not skip the finished runs:\n{second.stdout}\n{second.stderr}")
for name in RUNS:
    check(open(os.path.join(out, name, "metrics.jsonl")).read() == metrics[name], f"{name}: metrics changed")

# Bad input fails with the file (and line) named and a non-zero exit.
report = os.path.join(source, "scripts", "report")
missing = subprocess.run([report, "--out", os.path.join(work, "r"), os.path.join(work, "nowhere")],
                         capture_output=True, text=True)
check(missing.returncode != 0 and "nowhere: no metrics.jsonl" in missing.stderr, f"missing run: {missing.stderr}")
broken = os.path.join(work, "broken.jsonl")
lines = metrics[RUNS[0]].splitlines()
with open(broken, "w") as f:
    f.write("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
bad = subprocess.run([report, "--out", os.path.join(work, "r"), broken], capture_output=True, text=True)
check(bad.returncode != 0 and f"{broken}:2: not a metrics row" in bad.stderr, f"bad line: {bad.stderr}")
with open(broken, "w") as f:  # a torn last line (a killed run) is dropped, not an error
    f.write(metrics[RUNS[0]] + '{"step": 8, "lo')
torn = subprocess.run([report, "--out", os.path.join(work, "torn"), broken], capture_output=True, text=True)
check(torn.returncode == 0 and "dropped a torn last line" in torn.stderr, f"torn line: {torn.stderr}")
no_epochs = os.path.join(work, "no_epochs.jsonl")
with open(no_epochs, "w") as f:
    for line in lines:
        row = json.loads(line)
        row.pop("epoch", None)
        f.write(json.dumps(row) + "\n")
step_only = subprocess.run([report, "--out", os.path.join(work, "r2"), "--x", "epoch", no_epochs],
                           capture_output=True, text=True)
check(step_only.returncode != 0 and "no \"epoch\"" in step_only.stderr, f"--x epoch without epochs: {step_only.stderr}")
# Invalid UTF-8 is named by file and line; figures not measured (null) or not numbers leave gaps.
with open(broken, "wb") as f:
    f.write(("\n".join([lines[0], "\udcff"]).encode("utf-8", "surrogateescape")) + b"\n" + "\n".join(lines[1:]).encode() + b"\n")
binary = subprocess.run([report, "--out", os.path.join(work, "r3"), broken], capture_output=True, text=True)
check(binary.returncode == 1 and f"{broken}:2: not a metrics row" in binary.stderr and "Traceback" not in binary.stderr,
      f"invalid UTF-8: {binary.stderr}")
gaps = os.path.join(work, "gaps.jsonl")
with open(gaps, "w") as f:
    for line in lines:
        row = json.loads(line)
        for key in ("val_loss", "grad_norm"):
            if key in row:
                row[key] = None if key == "val_loss" else "n/a"
        f.write(json.dumps(row) + "\n")
gapped = subprocess.run([report, "--out", os.path.join(work, "r4"), gaps], capture_output=True, text=True)
check(gapped.returncode == 0, f"null and text figures: {gapped.stderr}")
# The sweep's summary over a corrupt run names it; over null figures it still writes its table.
summary_py = os.path.join(source, "apps", "vit", "sweep_summary.py")
for name, text, code, expected in (
        ("lamb_b64_lr0.1", metrics[RUNS[0]].replace('"val_loss"', '"val_loss": null, "x"', 1), 0, "| LAMB | 64 |"),
        ("adamw_b64_lr0.1", "{broken\n" + metrics[RUNS[1]], 1, "adamw_b64_lr0.1/metrics.jsonl:1: not a metrics row")):
    sweep_dir = os.path.join(work, "summary_" + name)
    os.makedirs(os.path.join(sweep_dir, name))
    with open(os.path.join(sweep_dir, name, "metrics.jsonl"), "w") as f:
        f.write(text)
    open(os.path.join(sweep_dir, name, "done"), "w").close()
    summarised = subprocess.run([sys.executable, summary_py, sweep_dir], capture_output=True, text=True)
    check(summarised.returncode == code and expected in summarised.stdout + summarised.stderr and
          "Traceback" not in summarised.stderr, f"sweep_summary on {name}: {summarised.stdout}{summarised.stderr}")

# The sweep's next rates: one step beyond the edge where the best rate is the highest or lowest tried.
sys.path.insert(0, os.path.join(source, "apps", "vit"))
import sweep_summary  # noqa: E402


def tried(optimizer, batch, lr, final, done=True):
    return {"optimizer": optimizer, "batch": batch, "lr": lr, "final": final, "done": done}


grid = [tried("lamb", 1536, 0.013, 85.0), tried("lamb", 1536, 0.026, 87.0), tried("lamb", 1536, 0.0065, 84.0),
        tried("adamw", 1536, 0.002, 85.0), tried("adamw", 1536, 0.004, 86.0), tried("adamw", 1536, 0.008, 85.5),
        tried("adamw", 8192, 0.008, 80.0), tried("adamw", 8192, 0.004, 81.0),
        tried("lamb", 8192, 0.03, 80.0), tried("lamb", 8192, 0.06, 79.0, done=False)]
proposals = sweep_summary.beyond_edges(grid, sweep_summary.best_per_setting(grid))
check(proposals == ["lamb 1536 0.052", "adamw 8192 0.002"], f"beyond_edges: {proposals}")
check(kuafu_report.centred_mean([1.0, 3.0, 5.0, 7.0], 1) == [2.0, 3.0, 5.0, 6.0], "centred_mean")
print("report test passed")
