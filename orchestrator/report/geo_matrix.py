"""Where DSD pays off on real geography: every measured country pair, predicted from a sweep.

    python -m orchestrator.report.geo_matrix OUT [--countries 20]    # after `dsdbed sweep experiments/geography.toml`

Reads the sweep's fitted parameters (OUT/summary.json: alpha, t_draft_edge, t_verify, t_ar, the
harness overhead included) and, for each country pair of data/country_rtt_stat.csv.gz, predicts the
per-token latency of cloud AR, co-located SD, synchronous and pipelined DSD at the pair's mean RTT
(the closed form, dsd.modes.predict_per_token_s). Writes

    OUT/geo_matrix.csv   one row per pair: rtt_ms, predicted ms per token per mode, the best DSD
                         mode's speedup over cloud AR and over co-located SD
    OUT/geo_matrix.png   two matrices over the `--countries` most measured countries (edge x cloud):
                         best-DSD speedup over cloud AR, and over co-located SD (> 1: DSD pays off)
    OUT/geo_check.csv    the sampled pairs the sweep measured: measured vs predicted, per mode

The experiment (experiments/geography.toml) measures a sample of pairs: its rtt_ms values are the
mean RTTs of the pairs that `sample_pairs()` picks (printed by ``--sample``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from dsd.modes import AR, BUILTIN, COLOCATED, edge_modes, predict_per_token_s
from dsd.costs.compute_times import ComputeTimes
from orchestrator.links import geography

SAMPLE = (
    ("CZ", "CZ"),
    ("ES", "ES"),
    ("DE", "DE"),
    ("DE", "FR"),
    ("DE", "US"),
    ("BR", "US"),
    ("IN", "US"),
    ("AU", "DE"),
)


def sample_pairs() -> list[tuple[str, str, float]]:
    """The pairs experiments/geography.toml measures, near to far, with their mean RTT (ms)."""
    return [(a, b, geography.pair_stats(a, b).mean_ms) for a, b in SAMPLE]


def predict_pairs(params: ComputeTimes, alpha: float, gamma: int) -> pd.DataFrame:
    rows = []
    for (a, b), (_, mean_ms, *_rest) in geography.load_pairs().items():
        row = {"country_a": a, "country_b": b, "rtt_ms": mean_ms}
        for mode in BUILTIN:
            row[f"{mode}_ms"] = 1e3 * predict_per_token_s(
                mode, alpha, gamma, mean_ms / 1e3, **params.closed_form_terms(gamma)
            )
        best = min(row[f"{mode}_ms"] for mode in edge_modes() if mode in BUILTIN)
        row["dsd_speedup_vs_ar"] = row[f"{AR}_ms"] / best
        row["dsd_speedup_vs_colocated"] = row[f"{COLOCATED}_ms"] / best
        rows.append(row)
    return pd.DataFrame(rows)


def top_countries(n: int) -> list[str]:
    pings: dict[str, int] = {}
    for (a, b), (count, *_rest) in geography.load_pairs().items():
        for c in {a, b}:
            pings[c] = pings.get(c, 0) + count
    return sorted(sorted(pings, key=pings.get, reverse=True)[:n])


def plot_matrices(pairs: pd.DataFrame, countries: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    index = {c: i for i, c in enumerate(countries)}
    fig, axes = plt.subplots(1, 2, figsize=(15, 6.8))
    for ax, column, label in (
        (axes[0], "dsd_speedup_vs_ar", "best DSD vs cloud AR"),
        (axes[1], "dsd_speedup_vs_colocated", "best DSD vs co-located SD"),
    ):
        grid = np.full((len(countries), len(countries)), np.nan)
        for row in pairs.itertuples():
            if row.country_a in index and row.country_b in index:
                value = getattr(row, column)
                grid[index[row.country_a], index[row.country_b]] = value
                grid[index[row.country_b], index[row.country_a]] = value
        image = ax.imshow(np.log2(grid), cmap="RdBu", vmin=-2, vmax=2)
        ax.set_xticks(range(len(countries)), countries, rotation=90, fontsize=7)
        ax.set_yticks(range(len(countries)), countries, fontsize=7)
        ax.set_xlabel("cloud country")
        ax.set_ylabel("edge country")
        ax.set_title(f"{label}: speedup (blue > 1: DSD pays off)", fontsize=9)
        bar = fig.colorbar(image, ax=ax, shrink=0.8)
        bar.set_ticks([-2, -1, 0, 1, 2], labels=["1/4", "1/2", "1", "2", "4"])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_sampled(out: Path, params: ComputeTimes, alpha: float, gamma: int) -> pd.DataFrame:
    """The measured points against the same predictions (the sampled pairs' RTTs)."""
    points = pd.read_csv(out / "points.csv")
    names = {round(rtt, 3): f"{a}-{b}" for a, b, rtt in sample_pairs()}
    rows = []
    for row in points.itertuples():
        predicted = 1e3 * predict_per_token_s(
            row.mode, alpha, gamma, row.rtt_ms / 1e3, **params.closed_form_terms(gamma)
        )
        rows.append(
            {
                "pair": names.get(round(row.rtt_ms, 3), ""),
                "mode": row.mode,
                "rtt_ms": row.rtt_ms,
                "per_token_ms_measured": row.per_token_ms_p50,
                "per_token_ms_predicted": predicted,
                "err_pct": 100 * (row.per_token_ms_p50 / predicted - 1),
            }
        )
    return pd.DataFrame(rows)


def write(out: Path, n_countries: int) -> dict:
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    params = ComputeTimes.from_dict(summary["params"])
    alpha, gamma = summary["alpha_measured"], int(summary["gamma"])
    if not math.isfinite(alpha):
        raise ValueError(f"{out}/summary.json: no single measured alpha (a sweep of one profile and alpha is needed)")
    pairs = predict_pairs(params, alpha, gamma)
    pairs.to_csv(out / "geo_matrix.csv", index=False)
    check = check_sampled(out, params, alpha, gamma)
    check.to_csv(out / "geo_check.csv", index=False)
    plot_matrices(
        pairs,
        top_countries(n_countries),
        out / "geo_matrix.png",
        f"{summary['experiment']}: alpha {alpha:.2f}, gamma {gamma}, t_ar {1e3 * params.t_ar_s:.1f} ms, "
        f"t_draft_edge {1e3 * params.t_draft_edge_s:.1f} ms; RIPE Atlas country-pair mean RTTs",
    )
    return {
        "pairs": len(pairs),
        "dsd_beats_ar_pct": 100 * float((pairs["dsd_speedup_vs_ar"] > 1).mean()),
        "dsd_beats_colocated_pct": 100 * float((pairs["dsd_speedup_vs_colocated"] > 1).mean()),
        "sampled_err_pct_median_abs": float(check["err_pct"].abs().median()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="a finished sweep folder (with summary.json)")
    parser.add_argument("--countries", type=int, default=20)
    parser.add_argument("--sample", action="store_true", help="print the sampled pairs and their mean RTTs")
    args = parser.parse_args()
    if args.sample or not args.out:
        for a, b, rtt in sample_pairs():
            print(f"{a}-{b}: {rtt:.3f} ms")
        return
    figures = write(Path(args.out), args.countries)
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
