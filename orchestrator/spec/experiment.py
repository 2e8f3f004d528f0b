"""Experiment files (TOML): validated before anything starts; a misspelt key is an error."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from dsd.backends.factory import BackendConfig, SyntheticBackendConfig, backend_from_dict
from dsd.controller.interface import CONTROLLERS, GAMMA_MAX
from dsd.modes import BUILTIN, CROSSOVERS, edge_modes, names
from dsd.costs.profiles import HardwareProfile, load_profiles, profiles_from_tables
from dsd.checks import check, is_int, is_number
from dsd.cache.speculation_cache import CacheConfig
from orchestrator.common.toml_tables import config_from_table
from orchestrator.links import keys as link_keys
from orchestrator.spec.sampling import SamplingSweep, Setting, parse_sampling
from orchestrator.spec.workload import Workload, parse_workload
from orchestrator.spec.external import ExternalConfig
from orchestrator.spec.arrivals import LoadConfig, SloConfig, parse_load, parse_slo
from orchestrator.spec.file_paths import paths_from_folder

LAUNCHERS = ("sim", "loopback", "netns", "compose", "external", "swarm", "auto")
# The most clients a point can have, and what holds them: the sim runs a coroutine per client
# (dsd/simulation/many_clients.py); on the others each client holds a session open on the one verifier,
# which admits max_sessions of them (services/verifier/limits.py VerifierLimits, 256 by default;
# more would be refused mid-grid, after the points before them ran).
MAX_NETWORK_CLIENTS = 256
CALIBRATE = ("first_repeat", "every_repeat")


@dataclass(frozen=True)
class Experiment:
    name: str
    launcher: str = "sim"
    modes: tuple[str, ...] = BUILTIN  # dsd/modes.py: the four of docs/concepts.md; any registered mode may be listed
    rtt_ms: tuple[float, ...] = (0.0, 10.0, 20.0, 40.0, 80.0)
    gamma: tuple[int, ...] = (4,)
    clients: tuple[int, ...] = (1,)
    requests: int = 8  # measured requests per point and client
    warmup_requests: int = 1  # run first and kept out of the results
    max_new_tokens: int = 64
    prompt_tokens: int = 32
    max_in_flight: int = 1
    # how the edges' per-round messages reach the verifier (services/frames.py): "ws", its
    # WebSocket, or "tcp", length-prefixed frames on a plain TCP connection to the same port
    transport: str = "ws"
    # network launchers: a request not done this long after its start is given up (its row's
    # gave_up says why, the point goes on); 0 = none (a stalled request waits for the link)
    request_deadline_s: float = 0.0
    # network launchers: cap TCP's retransmission backoff on the edges' links, both ends, in ms
    # (services/frames.py cap_retransmission_backoff; Linux >= 6.15); 0 = the kernel's
    tcp_rto_max_ms: int = 0
    edges: int = 4  # edge processes/containers; clients share them round-robin
    max_batch: int = 1  # verifier: sequences per verification pass (1 = serial)
    batch_window_ms: float = 0.0  # verifier: how long a pass waits to fill its batch
    repeats: int = 1
    # which repeats calibrate (orchestrator/analysis/predictions.py): "first_repeat", repeat 0's calibration
    # points predict every other point; "every_repeat", each planned repeat's own calibration
    # points predict that repeat's other points (with workload rotate = "repeat", the same requests)
    calibrate: str = "first_repeat"
    seed: int = 0
    retries: int = 1  # a failed point is run again this often, after healing the testbed
    retry_backoff_s: float = 2.0  # wait before a retry (times the attempt number)
    # synthetic backend: hardware profile name (dsd/costs/profiles.toml), or a list of them to sweep
    profile: str | tuple[str, ...] = ""
    alpha: tuple[float, ...] = ()  # synthetic backend: acceptance rates to sweep (empty: backend.alpha)
    # network launchers: pin verifier, edges, shaper, orchestrator to disjoint CPU sets
    # (orchestrator/common/cpus.py): auto = where there are >= 4 CPUs, on = always, off = never
    cpu_pinning: str = "auto"
    # repeats where they matter (orchestrator/running/repeat_until_ci.py): after the grid, add repeats of the
    # points bracketing a crossover until its 95% CI is at most adaptive_ci_target_pct of it,
    # spending at most adaptive_budget_points extra points (0: off)
    adaptive_budget_points: int = 0
    adaptive_ci_target_pct: float = 20.0
    adaptive_crossovers: tuple[str, ...] = ()  # the crossovers the extra repeats serve (empty: every one)
    backend: BackendConfig = field(default_factory=SyntheticBackendConfig)  # [backend]: kind and its fields
    sampling: SamplingSweep = field(default_factory=SamplingSweep)  # [sampling], orchestrator/spec/sampling.py
    workload: Workload = field(default_factory=Workload)  # [workload], orchestrator/spec/workload.py
    cache: CacheConfig = field(
        default_factory=CacheConfig
    )  # [cache]: the cached mode's (dsd/cache/speculation_cache.py)
    # The link beyond its RTT (netns, compose): each swept like rtt_ms; see orchestrator/links/keys.py.
    jitter_ms: tuple[float, ...] = (0.0,)
    delay_distribution: tuple[str, ...] = ("uniform",)
    correlation_pct: tuple[float, ...] = (0.0,)
    loss_pct: tuple[float, ...] = (0.0,)
    rate_mbit: tuple[float, ...] = (0.0,)  # 0 = no cap
    delay_up_ms: tuple[float, ...] = ()  # with delay_down_ms: one-way delays instead of rtt_ms
    delay_down_ms: tuple[float, ...] = ()
    link: link_keys.LinkOptions = field(default_factory=link_keys.LinkOptions)  # [link]: per-edge links
    # Adaptive DSD (dsd/controller/interface.py): who picks each round's gamma and mode (static: the point's),
    # and the largest gamma it may pick. The point's gamma and mode are where it starts.
    controller: str = "static"
    gamma_max: int = GAMMA_MAX
    # what the controller may pick (empty: the edge modes, per round). Listing ar or colocated lets
    # it hand a request, or the rest of one, to the server (dsd/drive/driver.py); the points' modes are
    # where it starts and must be among them.
    controller_modes: tuple[str, ...] = ()
    # the file's own [profiles.NAME] tables and those of `--profiles FILE`, beside dsd/costs/profiles.toml
    hardware_profiles: tuple[HardwareProfile, ...] = ()
    external: ExternalConfig | None = None  # [external]: services started elsewhere (launcher "external")
    # [load]: open-loop arrivals (orchestrator/spec/arrivals.py); None keeps the closed-loop clients above.
    load: LoadConfig | None = None
    slo: SloConfig | None = None  # [slo]: what a served request must meet (with [load])

    def __post_init__(self) -> None:
        self._check_grid()
        self._check_counts()
        _check_backend(self.backend, self.profile)
        self._check_synthetic_sweep()
        self._check_external()
        self._check_tables()
        self._check_profiles()
        link_keys.check_link_keys(self)
        self._check_controller()
        check(
            self.slo is None or self.load is not None,
            "slo",
            self.slo,
            "a [load] table beside it (an SLO is judged on open-loop arrivals)",
        )

    def _check_grid(self) -> None:
        check(self.launcher in LAUNCHERS, "launcher", self.launcher, f"one of {LAUNCHERS}")
        check(self.transport in ("ws", "tcp"), "transport", self.transport, "one of ws, tcp")
        check(
            is_number(self.request_deadline_s) and self.request_deadline_s >= 0,
            "request_deadline_s",
            self.request_deadline_s,
            "a number of seconds >= 0 (0 = none)",
        )
        check(
            is_int(self.tcp_rto_max_ms) and self.tcp_rto_max_ms >= 0,
            "tcp_rto_max_ms",
            self.tcp_rto_max_ms,
            "a whole number of ms >= 0 (0 = the kernel's backoff)",
        )
        check(self.calibrate in CALIBRATE, "calibrate", self.calibrate, f"one of {CALIBRATE}")
        check(self.cpu_pinning in ("auto", "on", "off"), "cpu_pinning", self.cpu_pinning, "one of auto, on, off")
        check(
            len(self.modes) > 0 and all(m in names() for m in self.modes),
            "modes",
            self.modes,
            f"a non-empty list from {names()}",
        )
        check(
            len(self.rtt_ms) > 0 and all(is_number(r) and 0 <= r <= 10_000 for r in self.rtt_ms),
            "rtt_ms",
            self.rtt_ms,
            "a non-empty list of numbers in 0..10000",
        )
        check(
            len(self.gamma) > 0 and all(is_int(g) and 1 <= g <= 64 for g in self.gamma),
            "gamma",
            self.gamma,
            "a non-empty list of whole numbers in 1..64",
        )
        max_clients, holder = (
            _max_sim_clients()
            if self.launcher == "sim"
            else (
                MAX_NETWORK_CLIENTS,
                "each client holds a session on the one verifier, whose max_sessions admits that many",
            )
        )
        check(
            len(self.clients) > 0 and all(is_int(c) and 1 <= c <= max_clients for c in self.clients),
            "clients",
            self.clients,
            f"a non-empty list of whole numbers in 1..{max_clients} on the {self.launcher} launcher ({holder})",
        )

    def _check_counts(self) -> None:
        for name, low in (
            ("requests", 1),
            ("warmup_requests", 0),
            ("max_new_tokens", 1),
            ("prompt_tokens", 1),
            ("max_in_flight", 1),
            ("repeats", 1),
            ("edges", 1),
            ("max_batch", 1),
            ("seed", 0),
            ("retries", 0),
            ("adaptive_budget_points", 0),
        ):
            value = getattr(self, name)
            check(is_int(value) and value >= low, name, value, f"a whole number >= {low}")
        check(self.retries <= 10, "retries", self.retries, "at most 10")
        check(
            self.adaptive_budget_points <= 10_000,
            "adaptive_budget_points",
            self.adaptive_budget_points,
            "at most 10000",
        )
        check(
            is_number(self.adaptive_ci_target_pct) and 0 < self.adaptive_ci_target_pct <= 1000,
            "adaptive_ci_target_pct",
            self.adaptive_ci_target_pct,
            "a number in (0, 1000]",
        )
        check(
            all(name in CROSSOVERS for name in self.adaptive_crossovers),
            "adaptive_crossovers",
            self.adaptive_crossovers,
            f"a list of crossover names from {sorted(CROSSOVERS)}",
        )
        for name in ("batch_window_ms", "retry_backoff_s"):
            value = getattr(self, name)
            check(is_number(value) and 0 <= value <= 3600, name, value, "a number in 0..3600")
        check(
            isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.name) is not None,
            "name",
            self.name,
            "1-64 of [A-Za-z0-9._-] (it names the result folder)",
        )

    def _check_synthetic_sweep(self) -> None:
        synthetic_only = "only with the synthetic backend (a real model pair has its own alpha and speed)"
        check(not self.alpha or self.backend.kind == "synthetic", "alpha", self.alpha, synthetic_only)
        check(all(is_number(a) and 0 < a <= 1 for a in self.alpha), "alpha", self.alpha, "a list of numbers in (0, 1]")
        check(len(set(self.alpha)) == len(self.alpha), "alpha", self.alpha, "no repeated values")
        check(
            not (self.alpha and (self.backend.acceptance_trace or self.backend.acceptance_rounds)),
            "alpha",
            self.alpha,
            "no alpha sweep with backend.acceptance_trace (the trace decides acceptance)",
        )
        if isinstance(self.profile, tuple):
            check(self.backend.kind == "synthetic", "profile", self.profile, "a list " + synthetic_only)
            check(
                len(self.profile) > 0 and len(set(self.profile)) == len(self.profile),
                "profile",
                self.profile,
                "a non-empty list of distinct profile names",
            )

    def _check_external(self) -> None:
        if self.launcher == "external":
            check(
                self.external is not None,
                "external",
                self.external,
                "an [external] table (verifier_url, edge_urls, token_file) with launcher = 'external'",
            )
            check(
                self.external.shaping != "off" or set(self.rtt_ms) == {0},
                "rtt_ms",
                self.rtt_ms,
                "[0] with [external] shaping = 'off' (the real link is measured, nothing is added)",
            )

    def _check_tables(self) -> None:
        check(isinstance(self.sampling, SamplingSweep), "sampling", self.sampling, "a [sampling] table")
        check(isinstance(self.workload, Workload), "workload", self.workload, "a [workload] table")
        check(isinstance(self.cache, CacheConfig), "cache", self.cache, "a [cache] table")
        check(
            self.backend.kind != "synthetic" or self.workload.source in ("heldout", "jsonl"),
            "workload.source",
            self.workload.source,
            "'heldout' or 'jsonl' with the synthetic backend (it has no tokenizer: its "
            "prompts are random ids, one per jsonl line, which gives their categories)",
        )

    def _check_profiles(self) -> None:
        check(
            all(isinstance(p, HardwareProfile) for p in self.hardware_profiles),
            "profiles",
            self.hardware_profiles,
            "[profiles.NAME] tables",
        )
        packaged = load_profiles()
        own = [p.name for p in self.hardware_profiles]
        for name in own:
            check(
                name not in packaged,
                f"profiles.{name}",
                name,
                "a name that dsd/costs/profiles.toml does not use already (choose another)",
            )
        check(len(set(own)) == len(own), "profiles", own, "each profile defined once (in the file or --profiles)")
        known = sorted(packaged) + own
        for name in self.profiles():
            check(
                not name or name in known,
                "profile",
                name,
                f"a profile of dsd/costs/profiles.toml, [profiles.NAME] or --profiles {known}",
            )

    def _check_controller(self) -> None:
        check(self.controller in CONTROLLERS, "controller", self.controller, f"one of {CONTROLLERS}")
        check(
            is_int(self.gamma_max) and 1 <= self.gamma_max <= 64, "gamma_max", self.gamma_max, "a whole number in 1..64"
        )
        if self.controller != "static":
            check(
                all(m in edge_modes() for m in self.modes),
                "modes",
                self.modes,
                f"only modes where the edge drafts {edge_modes()} with controller {self.controller!r}",
            )
            check(
                max(self.gamma) <= self.gamma_max,
                "gamma",
                self.gamma,
                f"at most gamma_max {self.gamma_max} with controller {self.controller!r}",
            )
        if self.controller_modes:
            check(
                self.controller != "static",
                "controller_modes",
                self.controller_modes,
                "none with controller 'static' (it always runs the point's mode)",
            )
            check(
                all(m in names() for m in self.controller_modes)
                and len(set(self.controller_modes)) == len(self.controller_modes),
                "controller_modes",
                self.controller_modes,
                f"distinct modes from {names()}",
            )
            check(
                all(m in self.controller_modes for m in self.modes),
                "controller_modes",
                self.controller_modes,
                f"every mode of modes {list(self.modes)} (a point's mode is where its controller starts)",
            )

    def profiles(self) -> tuple[str, ...]:
        return self.profile if isinstance(self.profile, tuple) else (self.profile,)

    def hardware_profile(self, name: str) -> HardwareProfile:
        """The named profile: the experiment's own, else dsd/costs/profiles.toml's."""
        own = {p.name: p for p in self.hardware_profiles}
        return own[name] if name in own else load_profiles()[name]

    def alphas(self) -> tuple[float, ...]:
        """The alphas swept; (None,) for a backend without one (a real model pair)."""
        return tuple(float(a) for a in self.alpha) or (getattr(self.backend, "alpha", None),)

    def for_group(self, profile: str, alpha: float | None) -> Experiment:
        """The experiment with one profile and one alpha: what one testbed runs."""
        backend = self.backend if alpha is None else replace(self.backend, alpha=alpha)
        return replace(self, profile=profile, alpha=(), backend=backend)

    def sampling_settings(self) -> list[Setting]:
        return self.sampling.settings(self.seed)


def _max_sim_clients() -> tuple[int, str]:
    # here, not at the top: the simulator imports torch, which only a sim experiment needs
    from dsd.simulation.many_clients import MAX_CLIENTS

    return MAX_CLIENTS, "the simulator's ceiling, dsd.simulation.many_clients.MAX_CLIENTS"


def _check_backend(backend: BackendConfig, profile) -> None:
    """What the backend needs of this host and of the experiment: its files, and a profile to
    emulate compute with."""
    check(isinstance(backend, BackendConfig), "backend", backend, "a [backend] table")
    if backend.emulated:
        check(
            bool(profile),
            "profile",
            profile,
            f"a hardware profile name (the {backend.kind} backend emulates its compute)",
        )
    try:
        backend.check_files()
    except ValueError as error:
        raise ValueError(f"experiment key {error}") from None


def load_experiment(path: Path, profiles_file: Path | None = None) -> Experiment:
    """An experiment file; ``profiles_file`` (the CLI's --profiles) adds hardware profiles in the
    format of dsd/costs/profiles.toml."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML: {error}") from None
    extra = ()
    if profiles_file is not None:
        if not Path(profiles_file).is_file():
            raise FileNotFoundError(f"--profiles {str(profiles_file)!r} does not exist or is not a file")
        try:
            extra = tuple(load_profiles(Path(profiles_file)).values())
        except ValueError as error:
            raise ValueError(f"--profiles {profiles_file}: {error}") from None
    return experiment_from_dict(paths_from_folder(data, Path(path).parent), source=str(path), extra_profiles=extra)


def experiment_from_dict(
    data: dict, source: str = "experiment", extra_profiles: tuple[HardwareProfile, ...] = ()
) -> Experiment:
    data = _parse_tables(dict(data), source)
    backend = data.pop("backend", {})
    tables = data.pop("profiles", {})
    external = data.pop("external", None)
    known = {f.name for f in fields(Experiment)} - {"backend", "hardware_profiles", "external"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {unknown}; known: {sorted(known | {'backend', 'profiles', 'external'})}"
        )
    if not isinstance(tables, dict):
        raise ValueError(f"{source}: experiment key 'profiles': expected [profiles.NAME] tables, got {tables!r}")
    try:
        data["hardware_profiles"] = tuple(profiles_from_tables(tables, prefix="profiles.").values()) + tuple(
            extra_profiles
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error}") from None
    if "name" not in data:
        raise ValueError(f"{source}: missing key 'name'")
    if "alpha" in data and "alpha" in backend:
        raise ValueError(f"{source}: alpha is given twice: as the sweep key 'alpha' and in [backend]; keep one")
    if isinstance(data.get("profile"), list):
        data["profile"] = tuple(data["profile"])
    if "rtt_ms" in data and ("delay_up_ms" in data or "delay_down_ms" in data):
        raise ValueError(f"{source}: give rtt_ms or delay_up_ms/delay_down_ms, not both")
    for key in (
        "modes",
        "rtt_ms",
        "gamma",
        "clients",
        "alpha",
        *link_keys.LINK_KEYS,
        "delay_down_ms",
        "controller_modes",
        "adaptive_crossovers",
    ):
        if key in data:
            value = data[key]
            data[key] = tuple(value) if isinstance(value, list) else (value,)
    try:
        backend_config = backend_from_dict(backend, where="[backend]")
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{source}: {error}" if "[backend]" in str(error) else f"{source}: [backend]: {error}"
        ) from None
    if external is not None:
        try:
            data["external"] = ExternalConfig.from_dict(external)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source}: {error}") from None
    try:
        return Experiment(backend=backend_config, **data)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source}: {error}") from None


def _parse_tables(data: dict, source: str) -> dict:
    """The experiment file's sub-tables ([sampling], [workload], [cache], [load], [slo], [link])
    as their typed configs, in place of the raw tables."""
    if "sampling" in data:
        data["sampling"] = parse_sampling(data.pop("sampling"), source)
    if "workload" in data:
        data["workload"] = parse_workload(data.pop("workload"), source)
    if "cache" in data:
        data["cache"] = config_from_table(CacheConfig, data.pop("cache"), "cache", source)
    if "load" in data:
        data["load"] = parse_load(data.pop("load"), source)
    if "slo" in data:
        data["slo"] = parse_slo(data.pop("slo"), source)
    if "link" in data:
        if not isinstance(data["link"], dict):
            raise ValueError(f"{source}: experiment key 'link': expected a table ([link]), got {data['link']!r}")
        try:
            data["link"] = link_keys.LinkOptions.from_dict(data["link"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{source}: {error}") from None
    return data
