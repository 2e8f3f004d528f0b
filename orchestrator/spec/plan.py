"""The plan of a sweep: its points (``Point``: mode, RTT, gamma, clients, repeat and the keys the
experiment sweeps), in the order they run, which of them calibrate, and the prompts each runs."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

from dsd.modes import AR, CACHED, COLOCATED, PIPELINED, SYNC, get_mode
from orchestrator.links import keys as link_keys
from orchestrator.spec.experiment import Experiment
from orchestrator.spec.sampling import Setting


@dataclass(frozen=True)
class Point:
    mode: str
    rtt_ms: float
    gamma: int
    clients: int
    repeat: int
    # Set only when the experiment sweeps them: the keys (folders) of experiments that do not
    # stay what they were, so their sweep folders still resume.
    alpha: float | None = None
    profile: str | None = None
    # The link beyond its RTT (orchestrator/links/keys.py), likewise set only when the experiment sweeps it.
    jitter_ms: float | None = None
    delay_distribution: str | None = None
    correlation_pct: float | None = None
    loss_pct: float | None = None
    rate_mbit: float | None = None
    delay_up_ms: float | None = None
    # The sampling setting (orchestrator/spec/sampling.py): always columns, in the key unless greedy.
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    sampling_seed: int = 0

    @property
    def key(self) -> str:
        group = f"_{self.group}" if self.group else ""
        sampling = f"_{self.sampling.tag}" if self.sampling.tag else ""
        return (
            f"{self.mode}_rtt{self.rtt_ms:g}ms{link_keys.key_suffix(self)}_g{self.gamma}_c{self.clients}"
            f"{group}{sampling}_r{self.repeat}"
        )

    @property
    def sampling(self) -> Setting:
        return Setting(self.temperature, self.top_k, self.top_p, self.sampling_seed)

    @property
    def group(self) -> str:
        """The (profile, alpha) group as a name, "" when the sweep varies neither."""
        return "_".join(
            ([f"a{self.alpha:g}"] if self.alpha is not None else [])
            + ([f"p{self.profile}"] if self.profile is not None else [])
        )

    def columns(self) -> dict:
        """The point's fields as trace columns, without the dimensions the sweep does not vary."""
        return {k: v for k, v in asdict(self).items() if v is not None}


# Calibration (see orchestrator/analysis/predictions.py): per (profile, alpha) group, the first repeat of
# these modes at the smallest RTT and client count of the grid (with calibrate = "every_repeat",
# every planned repeat's). They run first in their repeat; the parameters fitted from them alone
# predict the other points of their calibration unit (calibration_unit) before any of them runs.
CALIBRATION_MODES = (AR, COLOCATED, SYNC, CACHED)  # the cached mode's: its hit rate


def is_calibration(point: Point, experiment: Experiment) -> bool:
    modes = [m for m in CALIBRATION_MODES if m in experiment.modes]
    if SYNC not in experiment.modes and PIPELINED in experiment.modes:
        modes.append(PIPELINED)  # t_verify and t_draft_edge then come from pipelined rounds
    calibrating = point.repeat < experiment.repeats if experiment.calibrate == "every_repeat" else point.repeat == 0
    if not calibrating or point.mode not in modes or point.clients != min(experiment.clients):
        return False
    # The link: the first of the sweep's links with the smallest RTT (its other keys as listed first).
    link = min(link_keys.link_axes(experiment), key=lambda axes: axes["rtt_ms"])
    return all(getattr(point, key) == value for key, value in link.items())


def calibration_unit(point: Point, experiment: Experiment) -> tuple:
    """The points one calibration predicts: the point's group, and with calibrate = "every_repeat"
    its planned repeat (repeats added after the plan, orchestrator/running/repeat_until_ci.py, have none)."""
    if experiment.calibrate == "every_repeat" and point.repeat < experiment.repeats:
        return point.group, point.repeat
    return point.group, None


def plan_points(experiment: Experiment) -> list[Point]:
    """Every point of the grid; within each calibration unit the calibration points first."""
    ordered = []
    for _, unit in itertools.groupby(_grid_points(experiment), key=lambda p: calibration_unit(p, experiment)):
        unit = list(unit)
        ordered += [p for p in unit if is_calibration(p, experiment)]
        ordered += [p for p in unit if not is_calibration(p, experiment)]
    return ordered


def _grid_points(experiment: Experiment) -> list[Point]:
    points = []
    profiles, alphas = experiment.profiles(), experiment.alphas()
    vary_profile, vary_alpha = len(profiles) > 1, len(alphas) > 1
    # (profile, alpha) groups outermost: on a network launcher each group needs its own services,
    # so a group's points run together on one testbed, then the next group's.
    # Repeats next: a slow drift of the machine then touches every repeat differently instead of
    # biasing one RTT; modes innermost, so modes compared at one RTT run together.
    for profile, alpha in itertools.product(profiles, alphas):
        group = {"alpha": alpha if vary_alpha else None, "profile": profile if vary_profile else None}
        for repeat, link, gamma, sampling, clients, mode in itertools.product(
            range(experiment.repeats),
            link_keys.link_axes(experiment),
            experiment.gamma,
            experiment.sampling_settings(),
            experiment.clients,
            experiment.modes,
        ):
            if not get_mode(mode).speculative and gamma != experiment.gamma[0]:
                continue  # AR does not depend on gamma: run it once
            points.append(Point(mode, gamma=gamma, clients=clients, repeat=repeat, **group, **link, **asdict(sampling)))
    return points


def point_experiment(experiment: Experiment, point: Point) -> Experiment:
    """The single-profile, single-alpha experiment that runs this point."""
    return experiment.for_group(
        point.profile if point.profile is not None else experiment.profiles()[0],
        point.alpha if point.alpha is not None else experiment.alphas()[0],
    )


def prompts_for_point(pool: list[list[int]], experiment, point) -> list[list[int]]:
    """The prompts one point runs: the whole pool when it is one point's worth, else the slice
    of its slot, taken in turn around the pool: a (repeat, RTT) slot, or with the workload's
    rotate = "repeat" the repeat alone."""
    per_point = experiment.warmup_requests + experiment.requests
    if len(pool) <= per_point:
        return pool
    if experiment.workload.rotate == "repeat":
        slot = point.repeat
    else:
        rtts = sorted({p.rtt_ms for p in plan_points(experiment)})  # also one-way delays' RTTs
        slot = point.repeat * len(rtts) + rtts.index(point.rtt_ms)
    start = slot * per_point
    return [pool[(start + i) % len(pool)] for i in range(per_point)]
