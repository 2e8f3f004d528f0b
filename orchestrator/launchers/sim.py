"""The ``sim`` launcher: real models and the real protocol code, on virtual time.

Compute times (``dsd.costs.compute_times.ComputeTimes``) are those measured on this machine (``dsd.costs.measurement``)
or taken from a hardware profile; the link is a constant RTT split evenly, a delay per message.
Every mode, cloud AR and co-located SD included, runs its message exchange on virtual time
(``dsd.simulation.one_client``). It predicts what the network launchers should measure, and runs anywhere in
seconds.

A ``SimTestbed`` is a Testbed (base.py) like the network ones, with no processes and no link to
shape, everything in this process. One client runs its requests one after another on a verifier
of its own (``dsd.simulation.one_client``). Several clients (``point.clients`` > 1) run in a closed loop on
one shared verifier (``dsd.simulation.many_clients``): each issues its next request when its last one
ends, and the verifier's device serves their jobs in turn, serial (``max_batch`` 1) or batched
at the compute times' batch curve. Its rows are those of services/traces.py, one run per client
(``client_id``) as on the network launchers; what it does not measure (``rtt_probe_ms``,
``app_delay_ms``; at one client also the clocks and the server's own measures) is left empty,
never filled with a configured value. Several clients' rounds carry the virtual clock's times
(drafting, send, receipt, the verifier's queue, compute and batch size), shared by the clients.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from dsd.backends.protocol import LanguageModel, SamplingParams
from dsd.controller.interface import GAMMA_MAX, ControllerConfig, Decision, RequestOutcome, ShadowDraft, request_cycle
from dsd.drive.generation import first_emission
from dsd.modes import plannable_edge_modes, server_modes
from dsd.controller.policies import make_controller
from dsd.drive.driver import DriverConfig, run_to_end
from dsd.simulation.one_client import LinkCosts, ServerCosts, simulate_dsd, simulate_on_server
from dsd.simulation.many_clients import MAX_CLIENTS, ClientsSetup, simulate_clients
from dsd.drive.batching import BatchingConfig
from dsd.cache.speculation_cache import CacheConfig
from dsd.speculation.stopping import StopRule
from dsd.costs.compute_times import ComputeTimes, steady_per_token_s
from orchestrator.launchers.base import EdgeHandle, LinkState, PointSettings
from netem.spec import LinkSpec
from orchestrator.records.request_stats import finish_point
from services.traces import REQUEST_COLUMNS, ROUND_COLUMNS, RequestRow, RoundRow, as_dict, cache_columns

SHAPER = "none (virtual link)"


class SimTestbed:
    """The sim launcher's testbed for one (profile, alpha) group: its model pair and compute times."""

    verifier_url = ""
    shaper = SHAPER
    shaper_reason = "sim launcher: the link is a constant RTT on virtual time"

    def __init__(self, draft, target, times: ComputeTimes, verifier: BatchingConfig = BatchingConfig()) -> None:
        self.draft, self.target, self.times = draft, target, times
        self.verifier = verifier  # the shared verifier's device, for points of several clients
        self.edges: list[EdgeHandle] = []  # no edge service: the client runs in this process

    def shape(self, rtt_ms_per_edge: list[float]) -> list[LinkState]:
        """The virtual link as configured; nothing is measured on it."""
        return [LinkState(edge="virtual", shaper=SHAPER, rtt_configured_ms=rtt_ms) for rtt_ms in rtt_ms_per_edge]

    def app_delay_ms(self, client_id: int) -> float:
        return 0.0

    def check(self) -> None:
        """A virtual link cannot stop being shaped."""

    def heal(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing was started."""

    def local_shaper(self) -> None:
        return None

    def local_processes(self) -> list:
        return []

    def run_point(self, point, prompts: list[list[int]], settings: PointSettings) -> tuple:
        """The point's one client runs its requests one after another, each on virtual time from 0;
        several clients share one verifier (``run_clients``)."""
        if point.clients != 1:
            return self.run_clients(point, prompts, settings)
        stop = StopRule(settings.max_new_tokens, self.target.eos_token_id)
        round_rows, request_rows = [], []
        # As on an edge (services/edge/): one controller for the client's run, which picks each
        # request's mode among its modes and learns across the requests.
        policy = (
            None
            if settings.controller == "static"
            else make_controller(
                ControllerConfig(
                    settings.controller,
                    point.gamma,
                    point.mode,
                    settings.gamma_max,
                    settings.controller_modes or plannable_edge_modes(),
                )
            )
        )
        schedule = settings.link_options.schedule if settings.link_options is not None else None
        link_at = rtt_schedule_s(schedule, point.rtt_ms) if schedule else (lambda _t: point.rtt_ms / 1e3)
        t_point_s = 0.0  # virtual time since the point's first request (warm-up included)
        client = SimClient(
            self.draft, self.target, self.times, stop, settings.max_in_flight, settings.gamma_max, settings.cache
        )
        for index, prompt in enumerate(prompts):
            request = SimRequest(point.mode, point.gamma, prompt, f"{point.key}-{index}", point.sampling.params(index))
            tokens, records, wall_s, ttft_s = run_request(
                client, request, lambda t, start=t_point_s: link_at(start + t), policy
            )
            t_point_s += wall_s
            keys = {
                "run_id": f"sim-{point.key}",
                "client_id": "0",
                "mode": point.mode,
                "gamma": point.gamma,
                "request_index": index,
            }
            round_rows += [as_dict(round_row(keys, record)) for record in records]
            request_rows.append(
                as_dict(
                    request_row(
                        {**keys, "category": category_of(settings, index)}, prompt, tokens, records, wall_s, ttft_s
                    )
                )
            )
        rounds, requests = finish_point(
            pd.DataFrame(round_rows, columns=ROUND_COLUMNS),
            pd.DataFrame(request_rows, columns=REQUEST_COLUMNS),
            settings.warmup,
            self.shaper,
            self.shape([point.rtt_ms]),
        )
        return rounds.to_dict("records"), requests.to_dict("records"), [], {}

    def run_clients(self, point, prompts: list[list[int]], settings: PointSettings) -> tuple:
        """The point's clients in a closed loop on one verifier (dsd.simulation.many_clients), each
        running every prompt in turn; one run (run id, client_id) per client. Each round carries
        its times on the point's virtual clock, which the clients share (dsd.simulation.many_clients
        RoundTimes: drafting, send, receipt, the verifier's queue, compute and batch size), so
        the analysis reads them as it reads a network launcher's."""
        check_clients_settings(point.clients, settings.controller)
        schedule = settings.link_options.schedule if settings.link_options is not None else None
        setup = ClientsSetup(
            point.clients,
            point.mode,
            point.gamma,
            self.times,
            rtt_schedule_s(schedule, point.rtt_ms) if schedule else (lambda _t: point.rtt_ms / 1e3),
            self.verifier,
            settings.max_in_flight,
            settings.gamma_max,
            settings.cache,
        )
        done = simulate_clients(
            setup,
            self.draft,
            self.target,
            prompts,
            StopRule(settings.max_new_tokens, self.target.eos_token_id),
            point.sampling.params,
            seq_prefix=point.key,
        )
        round_rows, request_rows = _clients_rows(point, prompts, settings, done)
        rounds, requests = finish_point(
            pd.DataFrame(round_rows, columns=ROUND_COLUMNS),
            pd.DataFrame(request_rows, columns=REQUEST_COLUMNS),
            settings.warmup,
            self.shaper,
            self.shape([point.rtt_ms]),
        )
        return rounds.to_dict("records"), requests.to_dict("records"), [], {}


def _clients_rows(point, prompts: list[list[int]], settings: PointSettings, done: list) -> tuple[list, list]:
    """The simulated clients' requests (dsd.simulation.many_clients.ClientRequest) as trace rows:
    one run (run id, client_id) per client, each round with its times on the point's virtual clock."""
    round_rows, request_rows = [], []
    for request in done:
        keys = {
            "run_id": f"sim-{point.key}-c{request.client}",
            "client_id": str(request.client),
            "mode": point.mode,
            "gamma": point.gamma,
            "request_index": request.index,
        }
        round_rows += [
            as_dict(dataclasses.replace(round_row(keys, record), **dataclasses.asdict(times)))
            for record, times in zip(request.rounds, request.round_times)
        ]
        request_rows.append(
            as_dict(
                request_row(
                    {**keys, "category": category_of(settings, request.index)},
                    prompts[request.index],
                    request.tokens,
                    request.rounds,
                    request.total_s,
                    request.first_token_s,
                )
            )
        )
    return round_rows, request_rows


def check_clients_settings(clients: int, controller: str) -> None:
    """What the sim launcher can run with several clients on one verifier; the message names the
    setting. The sweep checks it before it starts (orchestrator/running/run.py)."""
    if not 1 <= clients <= MAX_CLIENTS:
        raise ValueError(f"clients must be in 1..{MAX_CLIENTS} on the sim launcher, got {clients!r}")
    if clients > 1 and controller != "static":
        raise ValueError(
            f"controller must be 'static' on the sim launcher with clients > 1 (its shared "
            f"verifier does not take hand-overs), got {controller!r} with {clients} clients"
        )


def category_of(settings: PointSettings, index: int) -> str:
    return settings.categories[index] if index < len(settings.categories) else ""


def rtt_schedule_s(schedule, base_rtt_ms: float):
    """The RTT (s) a link schedule (RTT steps) gives t_s after the point's start, by bisection: a
    measured trace has thousands of steps and a point asks once per round.
    NOTE: cloud AR and co-located SD keep the RTT in force at their request's start for the whole
    request (dsd.simulation.one_client's server streams have one link cost), so a stall inside such a request
    is not simulated; sync and pipelined DSD follow the schedule round by round."""
    steps = schedule.specs(LinkSpec(rtt_ms=base_rtt_ms))
    times_s = [at_s for at_s, _ in steps]
    rtts_s = [spec.expected_rtt_ms() / 1e3 for _, spec in steps]

    def rtt_at(t_s: float) -> float:
        i = bisect.bisect_right(times_s, t_s)
        return rtts_s[i - 1] if i else base_rtt_ms / 1e3

    return rtt_at


def round_row(keys: dict, record) -> RoundRow:
    """A simulated round (dsd.drive.generation.RoundRecord) as a trace row; it keeps no clock."""
    return RoundRow(
        **keys,
        round_index=record.round_index,
        proposed=record.proposed,
        accepted=record.accepted,
        emitted=record.emitted,
        stale=record.stale,
        round_gamma=record.gamma or None,
        round_mode=record.mode,
        **cache_columns(record.cache),
    )


def request_row(
    keys: dict, prompt: list[int], tokens: list[int], rounds: list, wall_s: float, ttft_s: float
) -> RequestRow:
    first_emitted = first_emission(rounds)
    return RequestRow(
        **keys,
        prompt_tokens=len(prompt),
        tokens=len(tokens),
        rounds=len(rounds),
        stale_rounds=sum(bool(r.stale) for r in rounds),
        wall_s=wall_s,
        ttft_s=ttft_s,
        steady_per_token_s=steady_per_token_s(ttft_s, wall_s, len(tokens) - first_emitted),
        token_ids=" ".join(map(str, tokens)),
    )


@dataclass(frozen=True)
class SimClient:
    """What a sim client keeps across its requests: the model pair, the compute times, the stop
    rule and the run's settings (checked where they entered: the experiment file)."""

    draft: LanguageModel
    target: LanguageModel
    times: ComputeTimes
    stop: StopRule
    max_in_flight: int = 1
    gamma_max: int = GAMMA_MAX
    cache: CacheConfig = CacheConfig()


@dataclass(frozen=True)
class SimRequest:
    """One request: its mode and gamma (a controller's decision replaces them), prompt, sequence
    id and sampling."""

    mode: str
    gamma: int
    prompt: list[int]
    seq_id: str
    sampling: SamplingParams = SamplingParams()


def run_request(client: SimClient, request: SimRequest, link_at: Callable[[float], float], policy=None):
    """Returns (generated tokens, round records, wall_s, ttft_s) on virtual time. Every mode runs
    its protocol (dsd.simulation.one_client): no time here comes from the closed form. ``link_at(t_s)``: the
    link's RTT t_s after the request starts.

    ``policy`` (a live dsd.controller.interface policy, kept across a run's requests) picks the request's mode
    among its modes (dsd.controller.interface.request_cycle, at the RTT in force when it starts) and then its
    rounds' plans; without it the request runs in its own mode and gamma."""
    if policy is None:
        return _run_in_mode(client, request, link_at, None)
    done = []

    async def run(decision: Decision) -> RequestOutcome:
        planned = dataclasses.replace(request, mode=decision.mode, gamma=decision.gamma)
        tokens, rounds, wall_s, ttft_s = _run_in_mode(client, planned, link_at, policy)
        done.append((tokens, rounds, wall_s, ttft_s))
        return RequestOutcome(tokens, wall_s, ttft_s, first_emission(rounds))

    shadow = ShadowDraft(client.draft, request.seq_id, request.prompt) if request.sampling.greedy else None
    decision = run_to_end(request_cycle(policy, link_at(0.0), run, shadow))
    tokens, rounds, wall_s, ttft_s = done[0]
    if decision.mode in server_modes():  # the plan columns say what the controller chose
        rounds = [dataclasses.replace(r, gamma=decision.gamma, mode=decision.mode) for r in rounds]
    return tokens, rounds, wall_s, ttft_s


def _run_in_mode(client: SimClient, request: SimRequest, link_at: Callable[[float], float], policy):
    times, mode, gamma, prompt = client.times, request.mode, request.gamma, request.prompt
    rtt_s = link_at(0.0)
    prefill_s = times.t_prefill_s(len(prompt) - 1)
    t_verify_s = times.t_verify_s(gamma)
    if mode in server_modes():
        server = ServerCosts(times.t_ar_s, times.t_draft_server_s, t_verify_s, prefill_s, rtt_s / 2)
        run = simulate_on_server(
            client.draft, client.target, prompt, gamma, client.stop, mode, server, request.sampling, request.seq_id
        )
        return run.generation.tokens, run.generation.rounds, run.total_s, run.first_token_s
    # t_ar_s and the server's draft step: what a hand-over to the server costs (dsd.drive.driver)
    # The edge sends the session's Open and drafts at once (services/edge/ does not wait for
    # Opened): the verifier prefills the Open before it serves the first block or hand-over.
    # A block is charged its own gamma's t_verify (an adaptive plan or a mode's own policy may
    # draft other than the configured gamma).
    link = LinkCosts(
        times.t_draft_edge_s,
        t_verify_s,
        rtt_s,
        times.t_ar_s,
        times.t_draft_server_s,
        rtt_at=link_at,
        t_verify_of=lambda g: times.t_verify_s(g) if times.knows_gamma(g) else t_verify_s,
        t_open_s=prefill_s,
    )
    config = DriverConfig(gamma, mode, client.max_in_flight, client.gamma_max, cache=client.cache)
    run = simulate_dsd(
        client.draft,
        client.target,
        prompt,
        client.stop,
        link,
        config,
        request.sampling,
        request.seq_id,
        controller=policy,
    )
    return run.generation.tokens, run.generation.rounds, run.total_s, run.first_token_s
