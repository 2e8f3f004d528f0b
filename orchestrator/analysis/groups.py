"""The analysis per group of a sweep: each profile's compute times fitted once over its rounds,
each group's points and its typed record (alphas, crossovers), and the capacity rows per subset of
a multi-client sweep. A group is one value of each group key the sweep varies
(points.varied_group_keys: profile, alpha, the link's keys, the sampling setting)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from dsd.analytic import latency_model as lm
from dsd.modes import edge_modes, speculative_modes
from dsd.costs.compute_times import ComputeTimes
from orchestrator.analysis import bootstrap, capacity
from orchestrator.analysis.fits import fit_alpha, fit_effective_params, fit_params
from orchestrator.analysis.points import (
    CROSSOVERS,
    GROUP_KEYS,
    add_predictions,
    measured_crossovers,
    point_keys,
    point_table,
    predicted_crossovers,
)
from orchestrator.analysis import wire as wire_prediction
from orchestrator.links import rows as link_rows


def assumed_params(sweep: dict, profile: str) -> ComputeTimes:
    """The compute times the sweep ran with (profile, or measured in-process before it)."""
    return ComputeTimes.from_dict(sweep.get("costs_by_profile", {}).get(profile) or sweep["costs"])


@dataclass(frozen=True)
class ProfileFit:
    """A profile's compute times: as the sweep ran with them (assumed), fitted from its rounds'
    compute (compute: what a saturated server's capacity depends on), and as the client sees them
    (params: compute plus the harness's measured per-round overhead; what the predictions use;
    = compute on the sim launcher)."""

    assumed: ComputeTimes
    compute: ComputeTimes
    compute_source: dict
    params: ComputeTimes
    params_source: dict
    overhead_ms: dict


def fit_profiles(sweep: dict, requests: pd.DataFrame, rounds: pd.DataFrame) -> dict[str, ProfileFit]:
    """Compute times are a property of the hardware: fitted once per profile over all its rounds."""
    fits = {}
    for profile in sorted(set(requests["profile"])) if "profile" in requests else [single_profile(sweep)]:
        profile_rounds = rounds[rounds["profile"] == profile] if "profile" in rounds else rounds
        if len(profile_rounds) and (profile_rounds["clients"] == 1).any():
            # One client alone: clients sharing a server add queueing, which is not a parameter.
            profile_rounds = profile_rounds[profile_rounds["clients"] == 1]
        assumed = assumed_params(sweep, profile)
        compute, compute_source = fit_params(profile_rounds, assumed)
        fits[profile] = ProfileFit(assumed, compute, compute_source, *fit_effective_params(profile_rounds, compute))
    return fits


def single_profile(sweep: dict) -> str:
    profile = sweep["experiment"]["profile"]
    return profile if isinstance(profile, str) else profile[0]


@dataclass
class GroupResult:
    """One group: its profile, the alpha measured over its rounds and the one configured, and its
    crossovers (rows that the intervals and the out-of-sample predictions fill in later); with the
    crossings measured and predicted at the measured alpha, which the plots draw."""

    keys: dict  # the group's value of each varied group key
    profile: str
    alpha_measured: float
    alpha_configured: float
    crossovers: dict  # name -> summary.json's crossover row
    measured: dict  # points.measured_crossovers
    predicted: dict  # points.predicted_crossovers at alpha_measured

    def entry(self) -> dict:
        """summary.json's entry of the group."""
        return {
            **self.keys,
            "profile": self.profile,
            "alpha_measured": self.alpha_measured,
            "alpha_configured": self.alpha_configured,
            "crossovers": self.crossovers,
        }

    def group_values(self) -> dict:
        """The group's values of the group keys, its profile always among them."""
        return {k: v for k, v in self.entry().items() if k in GROUP_KEYS}


def analyze_group(
    sweep: dict,
    group: dict,
    requests: pd.DataFrame,
    rounds: pd.DataFrame,
    links: pd.DataFrame,
    fits: dict[str, ProfileFit],
    gamma: int,
) -> tuple[pd.DataFrame, GroupResult]:
    """One group's points.csv rows (statistics, predictions at the measured and configured alpha)
    and its record; ``group``: its value of each varied group key."""
    profile = group.get("profile", single_profile(sweep))
    fit = fits[profile]
    spec_rounds = rounds[rounds["mode"].isin(speculative_modes())] if len(rounds) else rounds
    alpha = fit_alpha(spec_rounds) if len(spec_rounds) else math.nan
    points = point_table(requests, rounds, links)
    points = link_rows.add_link_columns(points, links, point_keys(requests))
    points = add_predictions(points, alpha, fit.params)
    points = wire_prediction.add_wire_prediction(
        points,
        wire_prediction.experiment_vocab(sweep["experiment"]),
        wire_prediction.experiment_features(sweep["experiment"]),
    )
    points["per_token_ms_predicted_compute_only"] = add_predictions(points, alpha, fit.compute)[
        "per_token_ms_predicted"
    ]
    points["alpha_measured_group"] = alpha
    alpha_configured = configured_alpha(sweep["experiment"], group)
    points = add_configured_alpha(points, alpha_configured, fit.params)
    if "profile" not in points:
        points.insert(0, "profile", profile)
    measured = measured_crossovers(points, gamma)
    predicted = predicted_crossovers(gamma, alpha, fit.params)
    crossovers = crossover_comparison(measured, predicted, set(points["mode"]))
    if not math.isnan(alpha_configured):
        at_configured = predicted_crossovers(gamma, alpha_configured, fit.params)
        for name, row in crossovers.items():
            row["predicted_rtt_ms_at_configured_alpha"] = at_configured[name]["rtt_ms"]
    return points, GroupResult(group, profile, alpha, alpha_configured, crossovers, measured, predicted)


def configured_alpha(experiment: dict, group: dict) -> float:
    """The alpha a group was configured with (synthetic backend); nan for a real model pair."""
    if experiment["backend"]["kind"] != "synthetic":
        return math.nan
    # a one-value alpha list is not a group key, but it is what ran (not the backend's default)
    alphas = experiment.get("alpha") or [experiment["backend"]["alpha"]]
    return float(group.get("alpha", alphas[0]))


def add_configured_alpha(points: pd.DataFrame, alpha_configured: float, params: ComputeTimes) -> pd.DataFrame:
    """alpha_configured beside alpha_measured, and the closed form at it beside the one at the
    measured alpha (per_token_ms_predicted)."""
    points = points.copy()
    points.insert(list(points.columns).index("alpha_measured"), "alpha_configured", alpha_configured)
    points["per_token_ms_predicted_at_configured_alpha"] = (
        math.nan
        if math.isnan(alpha_configured)
        else add_predictions(points, alpha_configured, params)["per_token_ms_predicted"]
    )
    return points


def crossover_comparison(measured: dict, predicted: dict, modes: set) -> dict:
    """Crossovers between modes the sweep ran."""
    return {
        name: {
            "measured_rtt_ms": measured.get(name, {}).get("rtt_ms", math.nan),
            "measured_rtt_ms_min": measured.get(name, {}).get("rtt_ms_min", math.nan),
            "measured_rtt_ms_max": measured.get(name, {}).get("rtt_ms_max", math.nan),
            "predicted_rtt_ms": predicted[name]["rtt_ms"],
        }
        for name, pair in CROSSOVERS.items()
        if set(pair) <= modes
    }


def frame_groups(frame: pd.DataFrame, keys: list[str]):
    """(values, rows) per group of `keys`; the whole frame when the sweep varies none of them."""
    if not keys:
        yield (), frame
        return
    for values, rows in frame.groupby(keys):
        yield (values if isinstance(values, tuple) else (values,)), rows


def select(frame: pd.DataFrame, keys: list[str], values: tuple) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = pd.Series(True, index=frame.index)
    for key, value in zip(keys, values):
        mask &= frame[key] == value
    return frame[mask]


def capacity_summary(
    points: pd.DataFrame, groups: list[GroupResult], compute: dict[str, ComputeTimes]
) -> tuple[pd.DataFrame, list[dict]]:
    """A multi-client sweep's per-client token rates (capacity.client_rates) and its capacity
    rows: per subset of the table and edge mode, the measured capacity ratio against its
    reference with its bootstrap interval, beside 1 + gamma*t_draft/t_verify (ratio_predicted)."""
    table = capacity.client_rates(points, GROUP_KEYS)
    rows = []
    subset_keys = [k for k in table.columns if k not in ("mode", "clients", "tok_s_per_client")]
    for values, subset_rows in frame_groups(table, subset_keys):
        subset = dict(zip(subset_keys, values))
        times, gamma = compute[subset.get("profile", groups[0].profile)], int(subset["gamma"])
        factor = {"ratio_predicted": lm.capacity_factor(gamma, times.t_draft_server_s, times.t_verify_s(gamma))}
        for mode in edge_modes():
            ratio = capacity.capacity_ratio(subset_rows, mode)
            if ratio:
                interval = bootstrap.capacity_ratio_interval(select(points, subset_keys, values), mode)
                rows.append({**subset, **ratio, **interval, **factor})
    return table, rows
