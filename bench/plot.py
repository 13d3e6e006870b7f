"""The PNG: throughput against TTFT p95, one labelled point per concurrency
level, in the LLM Almanac's manner. matplotlib is an optional extra."""

from __future__ import annotations

from pathlib import Path

ACCENT = "#2f9e44"
INK = "#343a40"


def require_matplotlib() -> None:
    """Fail before the benchmark, not after minutes of load."""
    from llmctl.extras import require

    require("plot")


def write_plot(run: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and none may exist
    import matplotlib.pyplot as plt

    levels = [lv for lv in run["levels"] if lv["ok"] and lv["ttft"]["p95"] is not None]
    xs = [lv["ttft"]["p95"] for lv in levels]
    ys = [lv["requests_per_s"] for lv in levels]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    try:
        ax.plot(xs, ys, "-", color=ACCENT, alpha=0.5, linewidth=1.5, zorder=1)
        ax.scatter(xs, ys, s=36, color=ACCENT, edgecolor="white", linewidth=1, zorder=2)
        for lv, x, y in zip(levels, xs, ys, strict=False):
            ax.annotate(f"{lv['concurrency']}", (x, y), textcoords="offset points",
                        xytext=(6, 5), fontsize=8, color=INK)
        # Latency spans orders of magnitude from serial to all-at-once.
        if xs and max(xs) > 10 * min(xs) > 0:
            ax.set_xscale("log")
        if run.get("slo_ttft"):
            ax.axvline(run["slo_ttft"], color="#c92a2a", linestyle="--", linewidth=1)
            ax.annotate(f"SLO {run['slo_ttft']:g} s", (run["slo_ttft"], 0),
                        xycoords=("data", "axes fraction"), xytext=(4, 4),
                        textcoords="offset points", fontsize=8, color="#c92a2a")
        wl = run["workload"]
        ax.set_title(f"{run['target']['model']} · {wl['name']} "
                     f"({wl['input_tokens']} in / {wl['output_tokens']} out)",
                     loc="left", fontsize=10, color=INK)
        ax.set_xlabel("TTFT p95 (s)   labels: concurrency", fontsize=9, color=INK)
        ax.set_ylabel("throughput (requests/s)", fontsize=9, color=INK)
        ax.set_ylim(bottom=0)
        if ax.get_xscale() == "linear":
            ax.set_xlim(left=0)
        ax.grid(True, color="#e9ecef", linewidth=0.8)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.tick_params(labelsize=8, colors=INK)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
