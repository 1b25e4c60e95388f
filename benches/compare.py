"""Turns the two benches' JSON into the comparison table (Markdown, on stdout) and a plot.

    python3 benches/compare.py benches/results/pinlane.json benches/results/py_compare.json docs/performance.png

Needs matplotlib only for the plot (`pip install matplotlib`); without it, the table is
still printed.
"""

import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    pin_path, spdl_path, png = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
    pin, spdl = load(pin_path), load(spdl_path)
    lim = pin["limits"]
    # spdl's rows: from the old spdl-only JSON, or the spdl half of spdl_compare.py's.
    spdl["rows"] = [dict(r, direction="H2D pageable" if r["direction"] == "H2D" else r["direction"])
                    for r in spdl["rows"] if r.get("lib", "spdl") in ("spdl", "spdl 0.8.0")]
    s_rows = {(r["batch"], r["direction"]): r for r in spdl["rows"]}
    print(f"Pinned limit measured by pinlane's bench: H2D {lim['h2d']:.1f} GB/s, D2H {lim['d2h']:.1f} GB/s, "
          f"both at once {lim['both']:.1f} GB/s (spdl's process: H2D {spdl['limits']['h2d']:.1f}, "
          f"D2H {spdl['limits']['d2h']:.1f}).\n")
    print("| batch | direction | pinlane GB/s | x limit | us/batch | spdl 0.8.0 GB/s | us/batch | pinlane / spdl |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in pin["rows"]:
        key = (r["batch"], "H2D pageable" if r["direction"] == "H2D pageable" else "D2H" if r["direction"].startswith("D2H") else None)
        s = s_rows.get(key)
        sg = f"{s['gbs']:.2f}" if s else "-"
        su = f"{s['median_us']:.1f}" if s else "-"
        ratio = f"{s['median_us'] / r['median_us']:.1f}x" if s else "-"
        print(f"| {r['batch']} | {r['direction']} | {r['gbs']:.2f} | {r['fraction_of_limit']:.3f} | "
              f"{r['median_us']:.1f} | {sg} | {su} | {ratio} |")
    if not png:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib missing: no plot)", file=sys.stderr)
        return
    batches = [b for b in dict.fromkeys(r["batch"] for r in pin["rows"]) if (b, "D2H") in s_rows]
    series = [
        ("pinlane H2D (pageable source)", "H2D pageable", pin, "#1f77b4", ""),
        ("pinlane D2H (page-locked out)", "D2H pinned out", pin, "#2ca02c", ""),
        ("pinlane D2H (pageable out)", "D2H pageable out", pin, "#98df8a", ""),
        ("spdl 0.8.0 H2D", "H2D pageable", spdl, "#d62728", "//"),
        ("spdl 0.8.0 D2H", "D2H", spdl, "#ff9896", "//"),
    ]
    fig, ax = plt.subplots(figsize=(11, 5))
    w = 0.16
    for k, (label, direction, src, color, hatch) in enumerate(series):
        rows = {(r["batch"], r["direction"]): r for r in src["rows"]}
        ys = [rows[(b, direction)]["gbs"] if (b, direction) in rows else 0 for b in batches]
        xs = [i + (k - 2) * w for i in range(len(batches))]
        ax.bar(xs, ys, w, label=label, color=color, hatch=hatch, edgecolor="white")
    ax.axhline(lim["h2d"], color="black", linestyle="--", linewidth=1, label=f"pinned limit ({lim['h2d']:.0f} GB/s)")
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels(batches)
    ax.set_ylabel("GB/s (whole calls, median)")
    ax.set_title("pinlane vs spdl 0.8.0, one H200 (PCIe Gen5), same machine, same day")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"\nwrote {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
