#!/usr/bin/env python3
"""Latency percentiles against load, from `specdec bench --output-format json` reports.

Each FILE is the JSON of one `specdec bench --url ...` run (or of the engine load mode,
--concurrency): one point per file. The x axis is the load the runs differ in: the request rate
(--request-rate; runs at inf are drawn at the largest measured rate), else the concurrency; --x
picks it (request_rate, concurrency, requests_per_s or throughput_tok_s, the last two measured).
Four panels, TTFT / TPOT / ITL / end to end in ms, each with its p50, p90 and p99 lines.

    for r in 1 2 4 8 inf; do
      build/specdec bench --url http://127.0.0.1:8080 --num-requests 64 --request-rate $r \\
          --output-format json > rate_$r.json
    done
    python3 bench/plot_latency.py rate_*.json -o latency.png

Needs matplotlib (not a dependency of the project: `pip install matplotlib`).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

METRICS = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "end to end")]
PERCENTILES = ["p50", "p90", "p99"]
X_CHOICES = ["auto", "request_rate", "concurrency", "requests_per_s", "throughput_tok_s"]


def load_reports(paths: list[str]) -> list[dict]:
    reports = []
    for path in paths:
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"plot_latency: {path}: {e}")
        missing = [m for m, _ in METRICS if m not in report]
        if missing:
            sys.exit(f"plot_latency: {path}: not a load report (no {', '.join(missing)})")
        reports.append(report)
    return reports


def rate_of(report: dict) -> float:
    rate = report.get("request_rate", "inf")
    return math.inf if rate in ("inf", None) else float(rate)


def pick_x(reports: list[dict], choice: str) -> str:
    if choice != "auto":
        return choice
    rates = {rate_of(r) for r in reports}
    if len(rates) > 1:
        return "request_rate"
    if len({r.get("concurrency") for r in reports}) > 1:
        return "concurrency"
    return "requests_per_s"


def x_values(reports: list[dict], x: str) -> tuple[list[float], str]:
    if x != "request_rate":
        labels = {"concurrency": "concurrency (requests in flight)",
                  "requests_per_s": "measured requests/s",
                  "throughput_tok_s": "measured output tokens/s"}
        return [float(r.get(x, 0)) for r in reports], labels[x]
    rates = [rate_of(r) for r in reports]
    finite = [v for v in rates if not math.isinf(v)]
    measured = [float(r.get("requests_per_s", 0)) for r in reports]
    cap = max(finite + measured + [1.0])
    label = "request rate (requests/s)"
    if any(math.isinf(v) for v in rates):
        label += f"; inf drawn at {cap:g}"
    return [cap if math.isinf(v) else v for v in rates], label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="JSON reports of specdec bench")
    parser.add_argument("-o", "--output", default="latency.png", help="image to write")
    parser.add_argument("--x", choices=X_CHOICES, default="auto", help="the x axis")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)

    reports = load_reports(args.files)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_latency: matplotlib is not installed (pip install matplotlib); "
                 "the JSON reports hold every figure this would draw")

    x = pick_x(reports, args.x)
    xs, xlabel = x_values(reports, x)
    order = sorted(range(len(reports)), key=lambda i: xs[i])
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (metric, name) in zip(axes.flat, METRICS):
        for p in PERCENTILES:
            ax.plot([xs[i] for i in order], [reports[i][metric][p] for i in order],
                    marker="o", label=p)
        ax.set_title(f"{name} (ms)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    for ax in axes[1]:
        ax.set_xlabel(xlabel)
    first = reports[0]
    fig.suptitle(args.title or f"{first.get('model', '')} {first.get('url', '')}".strip())
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output} ({len(reports)} runs, x = {x})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
