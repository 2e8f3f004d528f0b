"""Run the services as child processes and drive runs through the edge's HTTP API.

For tests, benchmarks and anything else that needs a verifier and an edge on this host: each
child gets its own process group, a readiness poll on /health that also notices a crash, a start
timeout, and is stopped by signalling its whole group (SIGTERM, then SIGKILL). A child also gets
SIGTERM when the thread that started it dies (services.processes: a killed pytest leaves no
services behind) and carries the service and owner marks, so `dsdbed cleanup` would find one
that outlived its owner anyway.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.access import bearer_header
from services.processes import REPO, free_port, start_service

__all__ = ["REPO", "Service", "free_port", "launch", "post_runs", "read_csv", "running", "wait_for_runs", "wait_ready"]
START_TIMEOUT_S = 60.0


@dataclass
class Service:
    name: str
    url: str
    process: subprocess.Popen
    log_path: Path
    token: str | None = None  # sent as a bearer token (a verifier started with --token-file)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def _get(self, path: str, timeout_s: float) -> bytes:
        request = urllib.request.Request(self.url + path, headers=bearer_header(self.token))
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read()

    def get_json(self, path: str, timeout_s: float = 10.0):
        return json.loads(self._get(path, timeout_s))

    def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        return self._get(path, timeout_s).decode()

    def post_json(self, path: str, body: dict, timeout_s: float = 10.0) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **bearer_header(self.token)},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def terminate(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)

    def wait_or_kill(self, timeout_s: float = 5.0) -> None:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)

    def stop(self) -> None:
        self.terminate()
        self.wait_or_kill()


def launch(module: str, args: list[str], log_dir: Path, host: str = "127.0.0.1") -> Service:
    port = free_port(host)
    log_path = Path(log_dir) / f"{module.rsplit('.', 1)[-1]}-{port}.log"
    with open(log_path, "wb") as log:
        process = start_service(
            [module, "--host", host, "--port", str(port), *args],
            f"{module}-{port}",
            log,
            env={"TRANSFORMERS_VERBOSITY": "error", "PYTHONUNBUFFERED": "1"},
        )
    return Service(module, f"http://{host}:{port}", process, log_path)


def wait_ready(service: Service, timeout_s: float = START_TIMEOUT_S) -> Service:
    deadline = time.monotonic() + timeout_s
    while True:
        if service.process.poll() is not None:
            raise RuntimeError(
                f"{service.name} exited with {service.process.returncode} while starting:\n{service.log()}"
            )
        try:
            if service.get_json("/health", timeout_s=1.0)["status"] == "ok":
                return service
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"{service.name} not ready within {timeout_s} s:\n{service.log()}")
        time.sleep(0.05)


@contextlib.contextmanager
def running(*specs: tuple[str, list[str]], log_dir: Path) -> Iterator[list[Service]]:
    """Start services side by side (each takes seconds to import torch), stop them all at the end."""
    services = [launch(module, args, log_dir) for module, args in specs]
    try:
        yield [wait_ready(service) for service in services]
    finally:
        for service in services:
            service.terminate()
        for service in services:
            service.wait_or_kill()


def post_runs(edge: Service, runs: list[dict]) -> list[str]:
    for run in runs:
        status, body = edge.post_json("/runs", run)
        if status != 201:
            raise RuntimeError(f"POST /runs answered {status}: {body}")
    return [run["run_id"] for run in runs]


def wait_for_runs(edge: Service, run_ids: list[str], timeout_s: float = 120.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        summaries = {run_id: edge.get_json(f"/runs/{run_id}") for run_id in run_ids}
        if all(s["status"] != "running" for s in summaries.values()):
            return summaries
        if edge.process.poll() is not None:
            raise RuntimeError(f"edge exited with {edge.process.returncode}:\n{edge.log()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs still running after {timeout_s} s: {summaries}")
        time.sleep(0.05)


def read_csv(edge: Service, run_id: str, name: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(edge.get_text(f"/runs/{run_id}/{name}"))))
