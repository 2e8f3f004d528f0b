"""The closed form's serialisation term under a rate cap: the bytes a round puts on the wire
each way, predicted per points.csv row (services/wire_size.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dsd import modes
from services import wire_size


def add_wire_prediction(
    points: pd.DataFrame, vocab: int | None = None, features: wire_size.FeatureWire | None = None
) -> pd.DataFrame:
    """The closed form with a serialisation term: under a rate cap every round also waits for its
    bytes to cross the wire each way, (bytes_up + bytes_down) / rate, shared by the tokens the
    round emits. Bytes per round are predicted from what a round carries (services/wire_size.py:
    a Verify's token ids, dense or sparse q rows, by gamma, vocab and sampling; a Tokens message
    where the verifier runs the request: ar, colocated; with a feature draft, ``features``, the
    target's features on every verdict, one row per emitted token), in wire_bytes_per_round_{up,down}_predicted
    beside the measured ones (links.csv; both count the pure ACKs, which the term leaves out: they
    leave while the other side computes). Where no prediction is possible (vocab unknown; the
    Verify's q rows under top-p without top-k) the measured bytes of that direction stand in (they
    also carry the session's Open and Opened, a feature draft's prompt features among them: a
    TTFT cost, which only the measured stand-in spreads over the rounds); with neither, or no cap,
    the column equals per_token_ms_predicted.
    per_token_ms_predicted_wire = per_token_ms_predicted + 8 (B_up + B_down) / (rate_mbit * 1e3) / tokens_per_round"""
    if points.empty or "per_token_ms_predicted" not in points:
        return points
    points = points.copy()
    predicted = [predicted_round_bytes(row, vocab, features=features) for row in points.to_dict("records")]
    points["wire_bytes_per_round_up_predicted"] = [up for up, _ in predicted]
    points["wire_bytes_per_round_down_predicted"] = [down for _, down in predicted]
    data = [predicted_round_bytes(row, vocab, acks=False, features=features) for row in points.to_dict("records")]
    up = pd.Series([u for u, _ in data], index=points.index, dtype=float)
    down = pd.Series([d for _, d in data], index=points.index, dtype=float)
    if "wire_bytes_per_round_up" in points and "wire_bytes_per_round_down" in points:
        up, down = up.fillna(points["wire_bytes_per_round_up"]), down.fillna(points["wire_bytes_per_round_down"])
    wire_bytes = up + down
    rate = points["rate_mbit"] if "rate_mbit" in points else pd.Series(0.0, index=points.index)
    per_round_ms = 8.0 * wire_bytes / (rate.where(rate > 0) * 1e3)
    per_token_ms = per_round_ms / points["tokens_per_round"].where(points["tokens_per_round"] > 0, 1.0)
    points["serialisation_ms_per_token"] = per_token_ms.fillna(0.0)
    points["per_token_ms_predicted_wire"] = points["per_token_ms_predicted"] + points["serialisation_ms_per_token"]
    return points


def predicted_round_bytes(
    point: dict, vocab: int | None, acks: bool = True, features: wire_size.FeatureWire | None = None
) -> tuple[float, float]:
    """(up, down) IP bytes of one round of a points.csv row; NaN where they cannot be predicted.
    Rows without sampling columns are greedy (every sweep before [sampling] was)."""
    nan = (math.nan, math.nan)
    get = lambda key, default: default if point.get(key) is None or point.get(key) != point.get(key) else point[key]  # noqa: E731
    if not vocab or get("gamma", None) is None:
        return nan
    gamma, mode = int(point["gamma"]), point.get("mode")
    if mode not in modes.names():
        return nan
    if mode not in modes.edge_modes():  # the verifier runs it: a Tokens message a round
        tokens = get("tokens_per_round", 1.0)
        return wire_size.stream_round_wire_bytes(max(1, round(tokens)), vocab, max(gamma, 1), acks)
    temperature, top_k, top_p = float(get("temperature", 0.0)), int(get("top_k", 0)), float(get("top_p", 1.0))
    rows = get("tokens_per_round", 1.0)  # a verdict carries a feature per emitted token
    if temperature > 0 and top_p < 1.0 and not top_k:
        # a nucleus keeps what the drafter's q gives it: the Verify's size is unknown, the verdict's
        # is not (its ACKs counted for a Verify of one segment)
        _, down = wire_size.round_wire_bytes(
            gamma,
            vocab,
            temperature,
            None,
            top_p,
            kept_per_row=1.0,
            acks=acks,
            features=features,
            feature_rows=rows if features else 0.0,
        )
        return math.nan, down
    return wire_size.round_wire_bytes(
        gamma,
        vocab,
        temperature,
        top_k or None,
        top_p,
        acks=acks,
        features=features,
        feature_rows=rows if features else 0.0,
    )


def experiment_features(experiment: dict) -> wire_size.FeatureWire | None:
    """How the verdicts carried the target's features (bfloat16, the runs' default), if the
    sweep's pair has a feature draft (its manifest's draft_kind); None otherwise."""
    backend = experiment.get("backend") or {}
    if backend.get("kind") != "hf" or not backend.get("pair_path"):
        return None
    try:
        manifest = json.loads((Path(backend["pair_path"]) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("draft_kind") != "eagle":
        return None
    return wire_size.FeatureWire(int(manifest["features"]["width"]), "bfloat16")


def experiment_vocab(experiment: dict) -> int | None:
    """The vocabulary the sweep's models drafted over (sweep.json's experiment): the synthetic
    backend's vocab_size, or the target model's config.json; None where it cannot be read."""
    backend = experiment.get("backend") or {}
    if backend.get("kind", "synthetic") == "synthetic":
        return backend.get("vocab_size", 512)
    folder = (
        Path(backend["target_path"]) if backend.get("target_path") else Path(backend.get("pair_path", "")) / "target"
    )
    try:
        return int(json.loads((folder / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
