"""The scale benchmark's chart: convergence vs N (gpunode, NFD, the reference write rate)
and the reaction latency distribution per N. Usage: plot.py results.json RAW_DIR OUT.png"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    results, raw, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    runs = json.loads(results.read_text())["runs"]
    ns = [r["n"] for r in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))

    a.plot(ns, [r["gpunode"]["convergence_s"] for r in runs], "o-", label="gpunode")
    a.plot(ns, [r["reference"]["n_over_rate_s"] for r in runs], "s--", label="reference: N / plain-client write rate")
    nfd = [(r["n"], r["nfd"]) for r in runs if r.get("nfd")]
    if nfd:
        a.plot([n for n, _ in nfd], [x["convergence_s"] for _, x in nfd], "^-", label="NFD nfd-master")
        for n, x in nfd:
            if x.get("projected"):
                a.annotate("projected", (n, x["convergence_s"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("nodes (N)")
    a.set_ylabel("seconds: policy applied → every node labelled")
    a.set_title("Convergence")
    a.grid(True, which="both", alpha=0.3)
    a.legend()

    for r in runs:
        # Single faults of every repetition, gpunode's solid and the floor's dotted.
        for controller, style in (("gpunode", "-"), ("floor", ":")):
            ms = sorted(
                x
                for run in r.get("reactions", [])
                if run["controller"] == controller
                for x in run["single"]["written_to_taint_ms"]
            )
            if not ms:
                continue
            ys = [(i + 1) / len(ms) for i in range(len(ms))]
            p50, p99 = ms[(len(ms) - 1) // 2], ms[max(0, -(-99 * len(ms) // 100) - 1)]
            b.step(ms, ys, where="post", linestyle=style, label=f"N={r['n']} {controller} (p50 {p50:.0f} ms, p99 {p99:.0f} ms)")
    b.axvline(1000, color="red", linestyle=":", label="p99 target 1 s")
    b.set_xscale("log")
    b.set_xlabel("milliseconds: report written → taint visible")
    b.set_ylabel("fraction of single faults")
    b.set_title("Reaction latency (CDF)")
    b.grid(True, which="both", alpha=0.3)
    b.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
