"""The compose launcher's config (``ComposeConfig``), validated on construction: what compose.yaml
is brought up with, and how (the launcher: orchestrator/launchers/compose.py)."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath

from dsd.checks import is_int, is_number
from dsd.backends.factory import BackendConfig, HfBackendConfig, SyntheticBackendConfig
from dsd.costs.profiles import HardwareProfile
from netem.probe import BACKENDS
from orchestrator.launchers.base import LauncherError
from orchestrator.launchers.services_config import ServicesConfig

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "compose.yaml"
MODELS_DIR = REPO / "models"
CONTAINER_MODELS_DIR = PurePosixPath("/app/models")  # where compose.yaml mounts ./models
BUILD_POLICIES = ("missing", "always", "never")
ADOPT_POLICIES = (False, True, "auto")
MAX_EDGES = 250
_PROJECT_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class ComposeError(LauncherError):
    """docker compose failed, or the project is not what was asked for."""


@dataclass(frozen=True)
class ComposeConfig:
    n_edges: int
    backend: BackendConfig = field(default_factory=SyntheticBackendConfig)
    profile: HardwareProfile | None = None  # emulated backends: the compute times to emulate
    threads: int = 1  # torch intra-op threads per container
    max_batch: int = 1  # verifier batching
    batch_window_ms: float = 0.0
    max_sessions: int = 256  # the verifier's admission limit (open sessions, all connections)
    project: str = "dsdbed"
    image: str = "dsdbed-app:latest"
    subnet: str = "172.31.250.0/24"
    # "always": run scripts/build_images.sh every time; incremental, ~1 s when nothing changed,
    # and the containers never run a stale copy of the code. "missing": only if there is no image.
    build: str = "always"
    # True: use the project that is up (it must be), and leave it up; "auto": that if one is up,
    # else bring one up (the sweep's choice); False: refuse a project that has containers.
    adopt: bool | str = False
    shaper_backend: str = "auto"  # netem: "auto", "kernel-netem" or "nfqueue"
    verify_count: int = 100  # echo probes per link after shaping; 0 = do not measure
    up_timeout_s: float = 600.0
    down_timeout_s: float = 120.0
    build_timeout_s: float = 1800.0
    compose_file: str = str(COMPOSE_FILE)
    log_dir: str = ""  # where close() saves `compose logs`; "" = nowhere

    @classmethod
    def from_services(cls, services: ServicesConfig, **overrides) -> ComposeConfig:
        """The sweep's launcher config (services_config.ServicesConfig) as a compose config."""
        if services.extra_verifier_args:
            raise ValueError(
                f"extra_verifier_args: the compose launcher cannot pass them, got {services.extra_verifier_args!r}"
            )
        return cls(
            **{
                "n_edges": services.n_edges,
                "backend": services.backend,
                "profile": services.profile,
                "max_batch": services.max_batch,
                "batch_window_ms": services.batch_window_ms,
                "log_dir": services.work_dir,
                **overrides,
            }
        )

    def __post_init__(self) -> None:
        for name, low, high in (
            ("n_edges", 1, MAX_EDGES),
            ("threads", 1, 256),
            ("max_batch", 1, 4096),
            ("max_sessions", 1, 1_000_000),
            ("verify_count", 0, 100_000),
        ):
            value = getattr(self, name)
            if not (is_int(value) and low <= value <= high):
                raise ValueError(f"{name} must be a whole number in [{low}, {high}], got {value!r}")
        for name in ("batch_window_ms", "up_timeout_s", "down_timeout_s", "build_timeout_s"):
            value = getattr(self, name)
            low_ok = value >= 0 if name == "batch_window_ms" else value > 0
            if not (is_number(value) and low_ok):
                raise ValueError(
                    f"{name} must be a finite number {'>= 0' if name == 'batch_window_ms' else '> 0'}, got {value!r}"
                )
        if not isinstance(self.backend, BackendConfig):
            raise ValueError(f"backend must be a BackendConfig, got {self.backend!r}")
        if getattr(self.backend, "device", "cpu") != "cpu":
            raise ValueError(f"backend.device must be 'cpu' in containers, got {self.backend.device!r}")
        if self.profile is not None and not isinstance(self.profile, HardwareProfile):
            raise ValueError(f"profile must be a HardwareProfile or None, got {self.profile!r}")
        if self.backend.emulated and self.profile is None:
            raise ValueError(
                f"profile: the {self.backend.kind} backend emulates its compute and needs a HardwareProfile, "
                "got None (e.g. dsd.costs.profiles.get_profile('toy-edge-cloud'))"
            )
        if not isinstance(self.project, str) or not _PROJECT_RE.match(self.project):
            raise ValueError(f"project must be lowercase letters, digits, '-' or '_', got {self.project!r}")
        if self.build not in BUILD_POLICIES:
            raise ValueError(f"build must be one of {BUILD_POLICIES}, got {self.build!r}")
        if self.shaper_backend not in ("auto", *BACKENDS):
            raise ValueError(f"shaper_backend must be 'auto' or one of {BACKENDS}, got {self.shaper_backend!r}")
        if not any(self.adopt is x if isinstance(x, bool) else self.adopt == x for x in ADOPT_POLICIES):
            raise ValueError(f"adopt must be true, false or 'auto', got {self.adopt!r}")
        try:
            subnet = ipaddress.IPv4Network(self.subnet)
        except ValueError as exc:
            raise ValueError(f"subnet must be an IPv4 network, got {self.subnet!r}: {exc}") from None
        if subnet.num_addresses - 3 < self.n_edges + 1:  # network, broadcast, Docker's gateway
            raise ValueError(f"subnet {self.subnet!r} has too few addresses for {self.n_edges} edges and a verifier")
        if not Path(self.compose_file).is_file():
            raise ValueError(f"compose_file {self.compose_file!r} does not exist")
        _ = self.container_backend  # validates the pair's location

    @property
    def container_backend(self) -> BackendConfig:
        """The backend as the containers see it: portable, an hf pair under /app/models (where
        compose.yaml mounts ./models)."""
        if not isinstance(self.backend, HfBackendConfig):
            return self.backend.portable()
        if self.backend.target_path:
            raise ValueError(
                "backend.target_path/draft_path: the compose launcher serves a pair folder under "
                f"{MODELS_DIR} (backend.pair_path), got target_path={self.backend.target_path!r}"
            )
        pair = Path(self.backend.pair_path).resolve()
        if not pair.is_relative_to(MODELS_DIR.resolve()):
            raise ValueError(
                f"backend.pair_path must lie under {MODELS_DIR} (mounted into the containers), "
                f"got {self.backend.pair_path!r}"
            )
        if not (pair / "manifest.json").is_file():
            raise ValueError(
                f"backend.pair_path {self.backend.pair_path!r} holds no manifest.json; "
                "build it with `dsdbed build-pair`"
            )
        return replace(
            self.backend, pair_path=str(CONTAINER_MODELS_DIR / pair.relative_to(MODELS_DIR.resolve()).as_posix())
        )

    @property
    def profile_json(self) -> str:
        if self.profile is None:
            return ""
        return json.dumps({k: v for k, v in asdict(self.profile).items() if k != "sources"})

    def compose_env(self) -> dict[str, str]:
        """The variables compose.yaml reads (its header lists them)."""
        return {
            "DSD_BACKEND_JSON": self.container_backend.to_json(),
            "DSD_PROFILE": "",
            "DSD_PROFILE_JSON": self.profile_json,
            "DSD_THREADS": str(self.threads),
            "DSD_MAX_BATCH": str(self.max_batch),
            "DSD_BATCH_WINDOW_MS": repr(float(self.batch_window_ms)),
            "DSD_MAX_SESSIONS": str(self.max_sessions),
            "DSD_IMAGE": self.image,
            "DSD_SUBNET": self.subnet,
        }
