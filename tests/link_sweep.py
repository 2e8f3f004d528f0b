"""The loss-and-jitter sweep that issue 16's tests run on each shaping launcher (netns, compose):
one small experiment, run end to end and analysed, and what every launcher must show for it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.report.analyze import analyze_sweep
from orchestrator.running.run import run_experiment


def run_loss_jitter_sweep(out: Path, launcher: str, **keys) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """AR and sync over the given link keys (jitter_ms, delay_distribution, loss_pct, ...) at 20 ms;
    returns requests.csv, links.csv and points.csv."""
    experiment = experiment_from_dict(
        {
            "name": f"lossjit-{launcher}",
            "launcher": launcher,
            "modes": ["ar", "sync"],
            "rtt_ms": [20],
            "gamma": [3],
            "clients": [1],
            "edges": 1,
            "requests": 2,
            "warmup_requests": 1,
            "max_new_tokens": 16,
            "prompt_tokens": 8,
            "profile": "toy-edge-cloud",
            "backend": {"kind": "synthetic", "alpha": 0.8},
            **keys,
        }
    )
    run_experiment(experiment, out, resume=False)
    analyze_sweep(out)
    return tuple(pd.read_csv(out / f"{name}.csv") for name in ("requests", "links", "points"))


def check_tokens_exact_and_link_columns(requests: pd.DataFrame, points: pd.DataFrame) -> None:
    """Loss and jitter slow a round, never change what it emits: every point and mode (AR: the
    target's greedy tokens) emits the same tokens; points.csv carries each point's link."""
    tokens = requests.groupby("request_index")["token_ids"].nunique()
    assert (tokens == 1).all(), requests[["point", "mode", "request_index", "token_ids"]]
    for column in (
        "jitter_ms",
        "loss_pct",
        "loss_link_pct",
        "loss_link_expected_pct",
        "rtt_link_stdev_ms",
        "rtt_link_expected_p50_ms",
    ):
        assert points[column].notna().all(), column


def check_links_shaped(out: Path) -> pd.DataFrame:
    """links.csv of a shaped network sweep: every link shaped by one of our backends, its probed
    p50 RTT within 1.5 ms of the configured one. Returns links.csv."""
    links = pd.read_csv(out / "links.csv")
    assert set(links["shaper"]) <= {"nfqueue", "kernel-netem"}
    error_ms = (links["rtt_measured_p50_ms"] - links["rtt_configured_ms"]).abs()
    assert error_ms.max() < 1.5, links[["rtt_configured_ms", "rtt_measured_p50_ms"]]
    return links
