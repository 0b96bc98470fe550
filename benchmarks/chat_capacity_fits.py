"""benchmarks/chat_capacity.sh's arithmetic, from the `kuafu-chat benchmark` JSON lines it wrote.

  chat_capacity_fits.py LINE STRATEGY DEVICE_MIB HOST_MIB   exit 0 when the probe fits (see the script)
  chat_capacity_fits.py --summary OUT DEVICE_MIB HOST_MIB   writes OUT/summary.md from OUT/<strategy>_<layers>.json
"""

import json
import os
import sys


def figures(line):
    """(footprint, host-resident, device side, whole run's footprint with building) in MiB of one line."""
    footprint = line["steps_peak_in_use_mb"] - line["in_use_before_model_mb"]
    host = (line.get("host_peak_mb", 0.0) + line.get("critic.host_peak_mb", 0.0) + line["reference_host_mb"]
            + line["reward_host_mb"])
    building = line["peak_in_use_mb"] - line["in_use_before_model_mb"]
    return footprint, host, footprint - host, building


def fits(line, device, host_budget):
    _, host, device_side, _ = figures(line)
    return device_side <= device and host <= host_budget


def probe(path, name, device, host_budget):
    line = json.load(open(path))
    footprint, host, device_side, _ = figures(line)
    ok = fits(line, device, host_budget)
    print(f"  {name}, {line['parameters'] / 1e6:.0f}M parameters per model: footprint {footprint:.0f} MiB, host-resident "
          f"{host:.0f} MiB, device side {device_side:.0f} MiB (budgets {device:.0f} / {host_budget:.0f}), "
          f"iteration {line['ppo_iteration_s']:.1f} s -> {'fits' if ok else 'too large'}", file=sys.stderr)
    return 0 if ok else 1


def summary(out, device, host_budget):
    labels = {"plain": "plain (all four models on the device)",
              "gemini": "Gemini (actor, critic all offloaded; reference, reward offloaded)",
              "gemini_disk": "Gemini, reference and reward on the disk tier",
              "gemini_all_disk": "Gemini, reference and reward on the disk tier, actor's and critic's master chunks too"}
    best = {}
    for name in labels:
        marker = os.path.join(out, f"{name}.largest")
        if os.path.exists(marker):
            best[name] = int(open(marker).read())
    rows = ["| strategy | largest actor | vs plain | footprint | host-resident | device side | whole run, building too | "
            "PPO iteration |", "|---|---|---|---|---|---|---|---|"]
    plain = None
    for name, layers in best.items():
        path = os.path.join(out, f"{name}_{layers}.json")
        if layers == 0 or not os.path.exists(path):
            rows.append(f"| {labels[name]} | none fits | | | | | | |")
            continue
        line = json.load(open(path))
        footprint, host, device_side, building = figures(line)
        params = line["parameters"]
        plain = params if name == "plain" else plain
        ratio = f"{params / plain:.1f}x" if plain else "-"
        rows.append(f"| {labels[name]} | {params / 1e6:.0f}M ({layers} layer{'s' if layers != 1 else ''}) | {ratio} | {footprint:,.0f} MiB | "
                    f"{host:,.0f} MiB | {device_side:,.0f} MiB | {building:,.0f} MiB | {line['ppo_iteration_s']:.1f} s |")
    text = (f"Budgets: device {device:.0f} MiB, host {host_budget:.0f} MiB; each of the four models has the actor's "
            "shape.\n\n" + "\n".join(rows) + "\n")
    open(os.path.join(out, "summary.md"), "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--summary":
        sys.exit(summary(sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
    if len(sys.argv) == 5:
        sys.exit(probe(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
