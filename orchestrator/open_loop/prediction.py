"""What an open-loop sweep predicts, computed before its first point runs (pure; the sweep writes
it to OUT/prediction.json with the time it was made, and judges its measurements against it).

Two figures per mode, for two different questions:

- ``steady``: the closed-form queueing model (``figures.ServingModel``, written out in
  docs/serving.md): the largest rate whose attainment in the steady state is at the level, from
  the profile's pass times alone. It is a property of the arrival *process*: the rate at which
  the expected share of requests meeting the SLO, over many independent runs, crosses the level.
- ``run``: the virtual-time model (``sim.simulate_serving``: the scheduler's rules, the
  profile's pass times, i.i.d. acceptance, each edge's constant RTT) run on the sweep's *own*
  arrival schedules (the same seeds, the same edges, the same warm-up and duration, from an empty
  server), searched on rate until its bracket is 0.5% wide. This is what one finite run is judged
  against: near saturation, whether a run's queue builds up before it ends depends on its arrival
  realisation, so one run's largest rate scatters around the steady figure by far more than the
  model's own error (docs/results/serving.md: 12-24% for one 30-s run), and no prediction of the
  process can be held to a few percent on one realisation. Conditioned on the realisation it can.
  This prediction *is* the simulator: agreement says the services, the kernel and the links
  behave as the simulator's model of them, not that the closed form holds (``steady`` against
  many repeats says that).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd

from orchestrator.spec.arrivals import OpenLoopRequest, SloConfig
from orchestrator.open_loop.figures import ServingModel, add_slo, max_rate, next_search_rate, point_figures
from orchestrator.open_loop.sim import ServingSetup, simulate_serving

RUN_RESOLUTION = 0.005  # the virtual-time search stops once its bracket is this narrow
RUN_MAX_STEPS = 30

# one (arrivals, seed) per repeat at a rate: the sweep's own schedules
Schedules = Callable[[float], list[tuple[list[OpenLoopRequest], int]]]


def virtual_points(setup: ServingSetup, schedules: Schedules, rate_rps: float, slo: SloConfig) -> list[dict]:
    """The virtual-time model's good and measured requests at one rate, one row per repeat."""
    rows = []
    for repeat, (arrivals, seed) in enumerate(schedules(rate_rps)):
        figures = (
            point_figures(add_slo(pd.DataFrame(simulate_serving(setup, arrivals, seed)), slo))
            if arrivals
            else {"requests_good": 0, "requests_measured": 0}
        )  # a rate too low for one arrival
        rows.append(
            {
                "rate_rps": rate_rps,
                "repeat": repeat,
                "requests_good": figures["requests_good"],
                "requests_measured": figures["requests_measured"],
            }
        )
    return rows


def virtual_max_rate(
    setup: ServingSetup,
    schedules: Schedules,
    slo: SloConfig,
    start_rps: float,
    resolution: float = RUN_RESOLUTION,
    max_steps: int = RUN_MAX_STEPS,
) -> dict:
    """The largest rate at which the virtual-time model, on these schedules, meets the level: the
    sweep's own rate search from ``start_rps`` without its attainment tolerance, down to
    ``resolution``; the crossing and its CI as a measurement's (``max_rate``)."""
    rows, rate = [], start_rps
    for _ in range(max_steps):
        rows += virtual_points(setup, schedules, rate, slo)
        rate = next_search_rate(pd.DataFrame(rows), slo.attainment, tolerance=0.0, resolution=resolution)
        if rate is None:
            break
    found = max_rate(pd.DataFrame(rows), slo.attainment)
    return {
        "max_rate_rps": found["max_rate_rps"],
        "max_rate_ci_low_rps": found["max_rate_ci_low_rps"],
        "max_rate_ci_high_rps": found["max_rate_ci_high_rps"],
        "rates_run": len({r["rate_rps"] for r in rows}),
    }


def predict_serving(
    model: ServingModel, slo: SloConfig, modes: list[str], runs: dict[str, tuple[ServingSetup, Schedules]]
) -> dict:
    """Per mode the closed form's steady-state figures, and where ``runs`` gives the mode's
    virtual-time setup and the sweep's schedules, the run's own prediction."""
    out = {"made_unix_s": time.time(), "modes": {}}
    for mode in modes:
        steady = model.max_rate_rps(mode, slo)
        row = {"steady_max_rate_rps": steady, "saturation_rps": model.saturation_rps(mode)}
        if mode in runs:
            setup, schedules = runs[mode]
            run = virtual_max_rate(setup, schedules, slo, steady if steady > 0 else model.saturation_rps(mode) / 4)
            row.update({f"run_{key}": value for key, value in run.items()})
        out["modes"][mode] = row
    return out
