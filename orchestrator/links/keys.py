"""The experiment's link keys: the link as a dimension of the sweep (its keys), the link of each
point and edge, and the link columns of the traces.

Sweep keys (each a list, or one value, like rtt_ms; the sweep is their product):

    jitter_ms = [0, 5]                 netem's jitter, per direction (see netem.spec)
    delay_distribution = ["normal"]    uniform (netem's default), normal, pareto, paretonormal
    correlation_pct = [0]              lag-1 correlation of successive delays and losses
    loss_pct = [0, 1]                  per direction
    rate_mbit = [0, 10]                per direction; 0 = no cap
    delay_up_ms = [5], delay_down_ms = [45]   asymmetric one-way delays, instead of rtt_ms

A key left at its default stays out of the point's key, folder and trace columns, so sweeps
written before these keys existed still resume. A point's link is `point_spec(point)`.

Per-edge links, the `[link]` table (`LinkOptions`), so one multi-client point mixes near and far
clients (client c runs on edge c mod edges):

    [link]
    edges = [{rtt_ms = 10}, {rtt_ms = 150, jitter_ms = 5}]   # edge i gets entry i mod len(edges)
    draw_rtt_ms = [10, 200]    # or: each edge's RTT drawn uniformly from [10, 200] ...
    seed = 1                   # ... with this seed (edge i: random.Random(seed * 1_000_003 + i))

    edges = [{edge_country = "IN", cloud_country = "US"}]      # the RTT drawn from measured
                               # country-pair statistics, per edge and seeded (orchestrator/links/geography.py)

An entry sets the keys it gives for its edge and takes the rest from the point (an entry with
rtt_ms replaces the point's rtt_ms for that edge; the point keeps its key). The draws are the same
at every point and repeat: edge i is the same near or far client throughout the sweep.

Link schedules (netns, compose; sim: RTT steps only, on virtual time with the point's requests
back to back): the link changes during every point, from when its runs start
(warm-up requests included), without restarting anything (`netem.schedule`, `Shaper.schedule`):

    [[link.schedule]]          # steps: each changes the keys it names, for every edge
    at_s = 5
    rtt_ms = 150
    # or: trace_csv = "traces/wan.csv"   (t_s, rtt_ms[, jitter_ms, loss_pct, rate_mbit])
    # [link] schedule_order = "path" (default) | "queue": after a cut in delay, may packets sent
    # after it overtake those sent before? path: yes, as on a route change (TCP may answer the
    # reordering with a spurious timeout: benchmarks/step_reorder.py); queue: no, the delay falls
    # as the held packets drain, as when a queue empties (NFQUEUE backend only)

links.csv gets one row per change and edge (change_index 1, 2, ...; the point's own link is
change 0) with its scheduled time and the time it took effect as an echo probe beside the run saw
it (change_t_unix_s, change_seen_t_unix_s, change_settle_ms; epoch seconds, as rounds.csv), and
change_settle_min_ms, when the last probe that still saw the old link was sent: the change took
effect between the two (a probe thread late to send widens the bracket; only a late link raises the
minimum); rounds.csv rows
carry the change in force when the round was sent (`link_change_index`, `link_rtt_configured_ms`).
The schedule during a point runs in orchestrator/links/scheduled_point.py; the rows of links.csv are
orchestrator/links/rows.py's, the wire-bytes prediction orchestrator/analysis/wire.py's.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from dsd.checks import fail, is_int, is_number
from netem.schedule import LinkSchedule, apply_changes
from netem.spec import DISTRIBUTIONS, LinkSpec, check_known_keys

# Sweep key -> its default (one value). Order = the order of the point key's suffix.
LINK_DEFAULTS = {
    "jitter_ms": 0.0,
    "delay_distribution": "uniform",
    "correlation_pct": 0.0,
    "loss_pct": 0.0,
    "rate_mbit": 0.0,
    "delay_up_ms": None,
}
LINK_KEYS = tuple(LINK_DEFAULTS)
_SUFFIX = {
    "jitter_ms": "j{:g}ms",
    "delay_distribution": "{}",
    "correlation_pct": "corr{:g}",
    "loss_pct": "loss{:g}",
    "rate_mbit": "rate{:g}mbit",
    "delay_up_ms": "up{:g}ms",
}
# Launchers that shape real packets; the others have a delay and nothing else.
SHAPING_LAUNCHERS = ("netns", "compose")


def _numbers(key: str, values, lo: float, hi: float, hi_open: bool = False) -> None:
    ok = len(values) > 0 and all(is_number(v) and lo <= v <= hi and not (hi_open and v == hi) for v in values)
    if not ok:
        upper = f"< {hi:g}" if hi_open else f"<= {hi:g}"
        fail(key, values, f"a non-empty list of numbers >= {lo:g} and {upper}")
    if len(set(values)) != len(values):
        fail(key, values, "no repeated values")


def check_link_keys(experiment) -> None:
    """Each link key on its own, then every combination the sweep will shape (so a jitter larger
    than some one-way delay fails here, naming the key, not halfway through the sweep)."""
    _numbers("jitter_ms", experiment.jitter_ms, 0, 10_000)
    _numbers("correlation_pct", experiment.correlation_pct, 0, 100, hi_open=True)
    _numbers("loss_pct", experiment.loss_pct, 0, 100, hi_open=True)
    _numbers("rate_mbit", experiment.rate_mbit, 0, 100_000)
    dists = experiment.delay_distribution
    if not dists or any(d not in DISTRIBUTIONS for d in dists) or len(set(dists)) != len(dists):
        fail("delay_distribution", dists, f"a non-empty list of distinct names from {DISTRIBUTIONS}")
    up, down = experiment.delay_up_ms, experiment.delay_down_ms
    if bool(up) != bool(down):
        fail(
            "delay_up_ms" if not up else "delay_down_ms",
            up or down,
            "delay_up_ms and delay_down_ms given together (one-way delays, in place of rtt_ms)",
        )
    if up:
        _numbers("delay_up_ms", up, 0, 5_000)
        _numbers("delay_down_ms", down, 0, 5_000)
    for axes in link_axes(experiment):
        try:
            base = _spec(axes)
        except ValueError as error:
            key = "jitter_ms" if "jitter_ms" in str(error) else "link"
            raise ValueError(f"experiment key {key!r}: {error} (at {axes})") from None
        for i in range(experiment.edges if experiment.link.per_edge else 0):
            try:
                edge_spec(base, experiment.link.edge_entry(i))
            except ValueError as error:
                raise ValueError(
                    f"experiment key 'link.edges[{i % max(len(experiment.link.edges), 1)}]': "
                    f"{error} (with the point's link {axes})"
                ) from None
        schedule = experiment.link.schedule
        for i in range(experiment.edges if experiment.link.per_edge else 1) if schedule else ():
            try:
                schedule.check(edge_spec(base, experiment.link.edge_entry(i)))
            except ValueError as error:
                raise ValueError(f"experiment key 'link.schedule': {error} (from the link {axes})") from None


def varied_link_keys(experiment) -> list[str]:
    """The link keys this experiment sets away from their defaults (they become point columns)."""
    keys = [k for k in LINK_KEYS if k != "delay_up_ms" and tuple(getattr(experiment, k)) != (LINK_DEFAULTS[k],)]
    return keys + (["delay_up_ms"] if experiment.delay_up_ms else [])


def link_axes(experiment) -> list[dict]:
    """Every (rtt_ms, link keys) combination of the sweep, rtt_ms outermost. Keys at their
    default are left out (None), so such points keep the keys they always had."""
    varied = varied_link_keys(experiment)
    if experiment.delay_up_ms:
        delays = [(up + down, up) for up, down in itertools.product(experiment.delay_up_ms, experiment.delay_down_ms)]
    else:
        delays = [(float(r), None) for r in experiment.rtt_ms]
    others = [k for k in varied if k != "delay_up_ms"]
    out = []
    for (rtt_ms, up), values in itertools.product(delays, itertools.product(*(getattr(experiment, k) for k in others))):
        axes = {
            "rtt_ms": float(rtt_ms),
            **{k: (v if k == "delay_distribution" else float(v)) for k, v in zip(others, values)},
        }
        if up is not None:
            axes["delay_up_ms"] = float(up)
        out.append(axes)
    return out


def _spec(axes: dict) -> LinkSpec:
    """The LinkSpec of one point's axes (the keys a point carries; absent ones at default)."""
    get = lambda key: axes.get(key) if axes.get(key) is not None else LINK_DEFAULTS[key]  # noqa: E731
    delays = {"rtt_ms": axes["rtt_ms"]}
    if axes.get("delay_up_ms") is not None:
        delays = {"delay_up_ms": axes["delay_up_ms"], "delay_down_ms": axes["rtt_ms"] - axes["delay_up_ms"]}
    return LinkSpec(
        **delays,
        jitter_ms=get("jitter_ms"),
        loss_pct=get("loss_pct"),
        rate_mbit=get("rate_mbit") or None,
        correlation_pct=get("correlation_pct"),
        distribution=get("delay_distribution"),
    )


def point_spec(point) -> LinkSpec:
    """The link one sweep point asks for (every edge's, unless the experiment gives per-edge links)."""
    return _spec({k: getattr(point, k, None) for k in ("rtt_ms", *LINK_KEYS)})


def as_spec(link) -> LinkSpec:
    """A launcher's shape() takes LinkSpecs or bare RTTs (ms)."""
    return link if isinstance(link, LinkSpec) else LinkSpec(rtt_ms=link)


def key_suffix(point) -> str:
    parts = [_SUFFIX[k].format(getattr(point, k)) for k in LINK_KEYS if getattr(point, k, None) is not None]
    return "".join(f"_{p}" for p in parts)


def check_launcher(experiment, launcher: str) -> None:
    """Only the shaping launchers can give a link jitter, loss, a rate or two different delays."""
    if launcher in SHAPING_LAUNCHERS:
        return
    options = experiment.link
    if options.schedule and launcher == "sim":
        other = sorted({k for step in options.schedule.steps for k, _ in step.changes} - {"rtt_ms"})
        if other:
            fail(
                "link.schedule",
                options.trace_csv or "steps",
                f"only rtt_ms steps on the sim launcher (its link is an RTT on virtual time), not {other}",
            )
        if options.schedule_order != "path":
            fail("link.schedule_order", options.schedule_order, "the default on the sim launcher (no packets)")
    elif options.schedule:
        fail(
            "link.schedule",
            options.trace_csv or "steps",
            f"none on the {launcher} launcher, which shapes no link (use netns or compose)",
        )
    if launcher == "sim" and options.per_edge:
        fail("link", "per-edge links", "none on the sim launcher (one client, one constant RTT)")
    for i, entry in enumerate(options.edges):
        if set(dict(entry)) - {"rtt_ms"}:
            fail(f"link.edges[{i}]", dict(entry), f"only rtt_ms on the {launcher} launcher (use netns or compose)")
    varied = varied_link_keys(experiment)
    if varied:
        fail(
            varied[0],
            getattr(experiment, varied[0]),
            f"its default on the {launcher} launcher, whose link is a constant RTT (use netns or compose)",
        )


# ---- per-edge links -----------------------------------------------------------------------------

# Keys an edge's entry may set (the point's link keys, in their experiment spelling).
EDGE_KEYS = (
    "rtt_ms",
    "delay_up_ms",
    "delay_down_ms",
    "jitter_ms",
    "delay_distribution",
    "correlation_pct",
    "loss_pct",
    "rate_mbit",
    "edge_country",
    "cloud_country",
)
COUNTRY_KEYS = ("edge_country", "cloud_country")
SCHEDULE_ORDERS = ("path", "queue")


@dataclass(frozen=True)
class LinkOptions:
    """The experiment's `[link]` table: per-edge links (see the module docstring)."""

    edges: tuple[tuple[tuple[str, object], ...], ...] = ()  # one entry per edge: sorted (key, value) pairs
    draw_rtt_ms: tuple[float, ...] = ()  # (low, high): each edge's RTT drawn uniformly
    seed: int = 0
    schedule: LinkSchedule = field(default_factory=LinkSchedule)  # steps, or the trace's rows
    trace_csv: str = ""  # where schedule came from, if a trace
    schedule_order: str = "path"  # "queue": packets never overtake across a step

    def __post_init__(self) -> None:
        if self.schedule_order not in SCHEDULE_ORDERS:
            fail("link.schedule_order", self.schedule_order, f"one of {list(SCHEDULE_ORDERS)}")
        if self.schedule_order != "path" and not self.schedule:
            fail(
                "link.schedule_order", self.schedule_order, "only with a link schedule ([[link.schedule]] or trace_csv)"
            )
        if self.edges and self.draw_rtt_ms:
            fail("link.draw_rtt_ms", list(self.draw_rtt_ms), "not given together with link.edges (choose one)")
        for i, entry in enumerate(self.edges):
            unknown = sorted(set(dict(entry)) - set(EDGE_KEYS))
            if unknown:
                fail(f"link.edges[{i}]", unknown, f"keys from {list(EDGE_KEYS)}")
            given = set(dict(entry)) & set(COUNTRY_KEYS)
            if given and given != set(COUNTRY_KEYS):
                fail(f"link.edges[{i}]", dict(entry), "edge_country and cloud_country given together")
            if given and set(dict(entry)) & {"rtt_ms", "delay_up_ms", "delay_down_ms"}:
                fail(f"link.edges[{i}]", dict(entry), "a delay (rtt_ms, delay_*_ms) or a country pair, not both")
            try:
                edge_spec(LinkSpec(rtt_ms=100), self.edge_entry(i))  # its own values valid on a roomy link
            except ValueError as error:
                raise ValueError(f"experiment key 'link.edges[{i}]': {error}") from None
        if self.draw_rtt_ms:
            lo_hi = self.draw_rtt_ms
            if len(lo_hi) != 2 or not all(is_number(x) and 0 <= x <= 10_000 for x in lo_hi) or lo_hi[0] > lo_hi[1]:
                fail("link.draw_rtt_ms", list(lo_hi), "[low, high] with 0 <= low <= high <= 10000")
        if not (is_int(self.seed) and self.seed >= 0):
            fail("link.seed", self.seed, "a whole number >= 0")

    @classmethod
    def from_dict(cls, data: dict) -> LinkOptions:
        check_known_keys(cls, data, "[link]")
        data = dict(data)
        if "edges" in data:
            if not isinstance(data["edges"], list) or not all(isinstance(e, dict) for e in data["edges"]):
                fail("link.edges", data["edges"], "a list of tables, one per edge")
            data["edges"] = tuple(tuple(sorted(e.items())) for e in data["edges"])
        if "schedule" in data and "trace_csv" in data:
            fail("link.trace_csv", data["trace_csv"], "not given together with [[link.schedule]] (choose one)")
        if "schedule" in data:
            if not isinstance(data["schedule"], list):
                fail("link.schedule", data["schedule"], "a list of steps ([[link.schedule]] tables)")
            try:
                data["schedule"] = LinkSchedule.from_steps(data["schedule"])
            except ValueError as error:
                raise ValueError(f"experiment key 'link.schedule': {error}") from None
        if "trace_csv" in data:
            try:
                data["schedule"] = LinkSchedule.from_trace_csv(data["trace_csv"])
            except (OSError, ValueError) as error:
                raise ValueError(f"experiment key 'link.trace_csv': {error}") from None
        if "draw_rtt_ms" in data:
            data["draw_rtt_ms"] = (
                tuple(data["draw_rtt_ms"]) if isinstance(data["draw_rtt_ms"], list) else (data["draw_rtt_ms"],)
            )
        return cls(**data)

    @property
    def per_edge(self) -> bool:
        return bool(self.edges or self.draw_rtt_ms)

    def edge_entry(self, index: int) -> dict:
        """What edge `index` sets for itself ({} = the point's link); a country pair becomes the
        RTT drawn for this edge from the pair's measurements (orchestrator/links/geography.py)."""
        if self.edges:
            entry = dict(self.edges[index % len(self.edges)])
            if "edge_country" in entry:
                from orchestrator.links import geography

                stats = geography.pair_stats(entry.pop("edge_country"), entry.pop("cloud_country"))
                rng = random.Random(self.seed * 1_000_003 + index)
                entry["rtt_ms"] = round(stats.draw_rtt_ms(rng), 3)
            return entry
        if self.draw_rtt_ms:
            rng = random.Random(self.seed * 1_000_003 + index)
            return {"rtt_ms": round(rng.uniform(*self.draw_rtt_ms), 3)}
        return {}


def edge_spec(base: LinkSpec, entry: dict) -> LinkSpec:
    """The point's link `base` with an edge's own keys on top."""
    return apply_changes(base, entry)


def edge_specs(options: LinkOptions | None, point, n_edges: int) -> list[LinkSpec]:
    """Each edge's link at this point."""
    base = point_spec(point)
    if options is None or not options.per_edge:
        return [base] * n_edges
    out = []
    for i in range(n_edges):
        try:
            out.append(edge_spec(base, options.edge_entry(i)))
        except ValueError as error:
            raise ValueError(f"experiment key 'link.edges[{i}]' at {point.key}: {error}") from None
    return out
