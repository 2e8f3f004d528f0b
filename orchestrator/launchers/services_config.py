"""What every launcher that starts the services is given: the backend, the hardware profile, how
many edges, the verifier's batching, and where logs go. Loopback and netns turn it into the
services' command lines; compose and swarm convert it to their own configs (from_services)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dsd.backends.factory import BackendConfig
from dsd.costs.profiles import HardwareProfile
from orchestrator.launchers.processes import backend_args


@dataclass(frozen=True)
class ServicesConfig:
    backend: BackendConfig
    profile: HardwareProfile | None = None
    n_edges: int = 1
    max_batch: int = 1
    batch_window_ms: float = 0.0
    ready_timeout_s: float = 120.0
    work_dir: str = ""  # service logs and the edges' run folders (default: a temp folder)
    extra_verifier_args: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not 1 <= self.n_edges <= 256:
            raise ValueError(f"n_edges must be in 1..256, got {self.n_edges!r}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch!r}")

    def verifier_argv(self, host: str, port: int, token_file: Path | None = None) -> list[str]:
        return [
            "services.verifier",
            "--host",
            host,
            "--port",
            str(port),
            "--max-batch",
            str(self.max_batch),
            "--batch-window-ms",
            str(self.batch_window_ms),
            *backend_args(self.backend, self.profile),
            *_token_args(token_file),
            *self.extra_verifier_args,
        ]

    def edge_argv(self, host: str, port: int, out_dir: Path, token_file: Path | None = None) -> list[str]:
        return [
            "services.edge",
            "--host",
            host,
            "--port",
            str(port),
            "--out-dir",
            str(out_dir),
            *backend_args(self.backend, self.profile),
            *_token_args(token_file),
        ]

    def make_work_dir(self) -> Path:
        path = Path(self.work_dir) if self.work_dir else Path(tempfile.mkdtemp(prefix="dsdbed-work-"))
        path.mkdir(parents=True, exist_ok=True)
        return path


def _token_args(token_file: Path | None) -> list[str]:
    return ["--token-file", str(token_file)] if token_file else []
