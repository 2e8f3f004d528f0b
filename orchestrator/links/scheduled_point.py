"""A link schedule during one point: the changes handed to the shaper, and echo probes beside
the run to see when each took effect (orchestrator/links/keys.py describes the schedule keys)."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import pandas as pd

from netem.schedule import LinkSchedule, effect_brackets
from netem.spec import LinkSpec
from orchestrator.links.rows import link_state_of

PROBE_INTERVAL_S = 0.01
EFFECT_TOLERANCE_MS = 2.0


class ScheduledPoint:
    """Runs a link schedule over one point: every change handed to the shaper at once (it times
    them), and echo probes from every edge beside the run, to see when each took effect.

        with ScheduledPoint(shaper, specs, schedule) as scheduled:   # starts the clock
            ... the point's runs ...
        rows = scheduled.rows()                                      # links.csv rows, one per change
    """

    def __init__(self, shaper, specs: list[LinkSpec], schedule: LinkSchedule, keep_order: bool = False):
        self.shaper, self.specs, self.schedule, self.keep_order = shaper, specs, schedule, keep_order
        self.t0_s = math.nan  # CLOCK_MONOTONIC
        self.unix_minus_mono_s = 0.0
        self.t_end_s = math.nan
        self._stop = threading.Event()
        self._timeline: list[list] = [[] for _ in specs]
        self._prober: threading.Thread | None = None

    def __enter__(self) -> ScheduledPoint:
        from netem import measure

        self.t0_s = time.monotonic() + 0.05  # the daemon gets the changes before the first
        # The traces' clock: the edges write wall-clock (epoch) times, kept on perf_counter.
        self.unix_minus_mono_s = time.time() - time.monotonic()
        per_edge = [self.schedule.specs(spec) for spec in self.specs]
        self.shaper.schedule(
            [(self.t0_s + at_s, [steps[k][1] for steps in per_edge]) for k, (at_s, _) in enumerate(per_edge[0])],
            keep_order=self.keep_order,
        )
        targets = [measure.RttTarget(link.name, link.edge.netns, link.verifier.ip) for link in self.shaper.links]
        n = int(3600 / PROBE_INTERVAL_S)  # bounded: an hour, or until the point ends
        self._prober = threading.Thread(
            target=measure.probe_rtts,
            name="dsdbed-schedule-probe",
            daemon=True,
            kwargs=dict(
                targets=targets,
                count=n,
                interval_s=PROBE_INTERVAL_S,
                timeout_s=1.0,
                stop=self._stop,
                timeline=self._timeline,
            ),
        )
        self._prober.start()
        return self

    def __exit__(self, *exc) -> None:
        self.t_end_s = time.monotonic()
        self._stop.set()
        if self._prober is not None:
            self._prober.join(timeout=10)

    def rows(self, link_states: list) -> list[dict]:
        """One links.csv row per (change that was due before the point ended, edge)."""
        from netem import measure

        out = []
        for edge_index, (spec, state) in enumerate(zip(self.specs, link_states)):
            steps = [(at_s, s) for at_s, s in self.schedule.specs(spec) if self.t0_s + at_s <= self.t_end_s]
            changes, old = [], spec.expected_rtt_ms(measure.PROBE_IP_BYTES)
            for at_s, new_spec in steps:
                new = new_spec.expected_rtt_ms(measure.PROBE_IP_BYTES)
                changes.append((self.t0_s + at_s, old, new))
                old = new
            seen = effect_brackets(changes, self._timeline[edge_index], EFFECT_TOLERANCE_MS)
            # Settle times are taken from the very float the brackets were found against: a bracket
            # that starts at the change is then exactly 0, not t0 + at - t0 - at (-7e-10 ms at CI's clock).
            for k, ((at_s, new_spec), (t_change_s, _, _), (t_not_before, t_seen)) in enumerate(
                zip(steps, changes, seen), start=1
            ):
                out.append(
                    {
                        **dataclasses.asdict(link_state_of(state.edge, state.shaper, new_spec)),
                        "change_index": k,
                        "change_at_s": at_s,
                        "change_source": self.schedule.source,
                        "change_t_unix_s": t_change_s + self.unix_minus_mono_s,
                        "change_seen_t_unix_s": t_seen + self.unix_minus_mono_s,
                        "change_settle_ms": 1000 * (t_seen - t_change_s),
                        "change_settle_min_ms": 1000 * (t_not_before - t_change_s),
                    }
                )
        return out

    def annotate_rounds(self, rounds: pd.DataFrame, n_edges: int) -> pd.DataFrame:
        """Each round with the link change in force when it was sent (t_send_s: the edges' epoch
        seconds), on its client's edge."""
        if rounds.empty or "t_send_s" not in rounds:
            return rounds
        rounds = rounds.copy()
        since_s = rounds["t_send_s"] - (self.t0_s + self.unix_minus_mono_s)
        edges = rounds["client_id"].astype(int) % n_edges
        rounds["link_change_index"] = [self.schedule.index_at(t) if t == t else -1 for t in since_s]
        rounds["link_rtt_configured_ms"] = [
            self.schedule.state_at(self.specs[e], t).expected_rtt_ms() if t == t else math.nan
            for e, t in zip(edges, since_s)
        ]
        return rounds
