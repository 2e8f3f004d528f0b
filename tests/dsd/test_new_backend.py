"""What a new backend takes: one module and one registry line. This file is the example: its
module part is ToyBackendConfig and ToyLM (a deterministic tiny LanguageModel), its registry line
the ``register_backend`` in the fixture (a shipped backend is a line in factory.BACKEND_CONFIGS).
Nothing else changes: the services take it whole from ``--backend-json``, the launchers pass it
on, an experiment's [backend] table names it by ``kind``."""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import aiohttp
import pytest
import torch
from aiohttp import web

from dsd.backends.factory import BACKEND_CONFIGS, load_pair, register_backend
from dsd.backends.protocol import BackendConfig, ForwardStats, LogitsRequest
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.launchers.processes import backend_args
from orchestrator.report.html import write_report
from orchestrator.running.run import run_experiment
from orchestrator.report.analyze import analyze_sweep
from services import edge as edge_service
from services import verifier as verifier_service
from services.compute import ThreadDevice, add_backend_args, backend_from_args, make_device


# ---- the new backend's module ------------------------------------------------------------------


@dataclass(frozen=True)
class ToyBackendConfig(BackendConfig):
    kind: ClassVar[str] = "toy"
    vocab_size: int = 50
    wrong_every: int = 3  # the draft misses the target's token at every wrong_every-th position

    def __post_init__(self) -> None:
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size!r}")

    def load(self):
        return ToyLM(self, "draft"), ToyLM(self, "target")


def toy_next(config: ToyBackendConfig, previous: int) -> int:
    return (7 * previous + 3) % config.vocab_size


class ToyLM:
    """The target's next token is toy_next(last token); the draft's is that but one, at every
    wrong_every-th position."""

    def __init__(self, config: ToyBackendConfig, role: str) -> None:
        self.config, self.role = config, role
        self.name, self.vocab_size, self.eos_token_id = f"toy-{role}", config.vocab_size, None
        self.stats = ForwardStats()
        self._cached: dict[str, int] = {}

    def logits(self, seq_id: str, tokens: Sequence[int], n_last: int) -> torch.Tensor:
        out = torch.zeros(n_last, self.vocab_size)  # [n_last, vocab]
        first = len(tokens) - n_last + 1
        for row in range(n_last):
            position = first + row
            token = toy_next(self.config, tokens[position - 1])
            if self.role == "draft" and position % self.config.wrong_every == 0:
                token = (token + 1) % self.vocab_size
            out[row, token] = 1.0
        self.stats.passes += 1
        self.stats.positions_fed += len(tokens) - min(self._cached.get(seq_id, 0), len(tokens) - n_last)
        self._cached[seq_id] = len(tokens)
        return out

    def logits_batch(self, requests: Sequence[LogitsRequest]) -> list[torch.Tensor]:
        return [self.logits(r.seq_id, r.tokens, r.n_last) for r in requests]

    def cached_length(self, seq_id: str) -> int:
        return self._cached.get(seq_id, 0)

    def crop(self, seq_id: str, length: int) -> None:
        if seq_id in self._cached:
            self._cached[seq_id] = min(self._cached[seq_id], length)

    def release(self, seq_id: str) -> None:
        self._cached.pop(seq_id, None)


# ---- its registry line -------------------------------------------------------------------------


@pytest.fixture
def toy():
    register_backend(ToyBackendConfig)
    yield ToyBackendConfig(vocab_size=40)
    del BACKEND_CONFIGS["toy"]


def greedy_reference(config: ToyBackendConfig, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(toy_next(config, tokens[-1]))
    return tokens[len(prompt) :]


# ---- nothing else: it runs --------------------------------------------------------------------


def test_the_services_take_the_toy_backend_whole_from_the_launchers_flags(toy):
    parser = argparse.ArgumentParser()
    add_backend_args(parser)
    backend, profile = backend_from_args(parser.parse_args(backend_args(toy, None)))
    assert backend == toy and profile is None
    draft, target = load_pair(backend)
    assert (draft.name, target.name, target.vocab_size) == ("toy-draft", "toy-target", 40)
    assert isinstance(make_device(backend), ThreadDevice)  # not emulated: passes compute for real


def test_a_toy_backend_runs_through_the_verifier_and_edge_services_on_loopback(toy, tmp_path):
    prompts = [[1, 2, 3], [5, 9]]
    rows = asyncio.run(asyncio.wait_for(serve_and_run(toy, prompts, tmp_path), 60))
    assert [r["error"] for r in rows["rounds"]] == [""] * len(rows["rounds"])
    for row in rows["requests"]:
        index = int(row["request_index"])
        assert [int(t) for t in row["token_ids"].split()] == greedy_reference(toy, prompts[index], 12)
    accepted = sum(int(r["accepted"]) for r in rows["rounds"])
    proposed = sum(int(r["proposed"]) for r in rows["rounds"])
    assert 0 < accepted < proposed  # the draft is right at most positions, not all


async def serve_and_run(backend: ToyBackendConfig, prompts: list[list[int]], tmp_path) -> dict[str, list[dict]]:
    """The services as their command lines make them, served on loopback in this process (the
    registration above lives here); one sync run posted to the edge's API, its traces read back."""
    backend_json = ["--backend-json", backend.to_json()]
    verifier_app, _ = verifier_service.build(["--port", "0", *backend_json])
    edge_app, _ = edge_service.build(["--port", "0", "--out-dir", str(tmp_path), *backend_json])
    runners = [web.AppRunner(app) for app in (verifier_app, edge_app)]
    try:
        urls = []
        for runner in runners:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        verifier_url, edge_url = urls
        run = {
            "run_id": "toy",
            "client_id": "c0",
            "mode": "sync",
            "gamma": 4,
            "prompts": prompts,
            "max_new_tokens": 12,
            "verifier_url": verifier_url,
            "probe_count": 1,
        }
        async with aiohttp.ClientSession() as http:
            async with http.post(edge_url + "/runs", json=run) as response:
                assert response.status == 201, await response.text()
            for _ in range(500):
                async with http.get(edge_url + "/runs/toy") as response:
                    status = (await response.json())["status"]
                if status != "running":
                    break
                await asyncio.sleep(0.05)
            assert status == "done"
            tables = {}
            for name in ("rounds", "requests"):
                async with http.get(f"{edge_url}/runs/toy/{name}.csv") as response:
                    tables[name] = list(csv.DictReader(io.StringIO(await response.text())))
        return tables
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def test_an_experiment_names_the_toy_backend_in_its_backend_table_and_sweeps_it(toy, tmp_path):
    experiment = experiment_from_dict(
        {
            "name": "toy",
            "launcher": "sim",
            "modes": ["ar", "sync"],
            "rtt_ms": [0, 20],
            "requests": 2,
            "warmup_requests": 0,
            "max_new_tokens": 10,
            "prompt_tokens": 4,
            "backend": {"kind": "toy", "vocab_size": 40},
        }
    )
    assert experiment.backend == toy and experiment.alphas() == (None,)
    points = run_experiment(experiment, tmp_path / "out", resume=False)
    assert len(points) == 4 and set(points["mode"]) == {"ar", "sync"} and set(points["status"]) == {"ok"}
    recorded = json.loads((tmp_path / "out" / "sweep.json").read_text())["experiment"]["backend"]
    assert recorded == {"kind": "toy", "vocab_size": 40, "wrong_every": 3}
    analyze_sweep(tmp_path / "out")  # what `dsdbed sweep` does next
    assert "toy, vocab_size 40, wrong_every 3" in write_report(tmp_path / "out").read_text()
    with pytest.raises(ValueError, match=r"unknown key.*alpha.*'toy'"):
        experiment_from_dict({"name": "toy", "launcher": "sim", "backend": {"kind": "toy", "alpha": 0.5}})
