"""The edge service (the device): the draft, an HTTP API for the orchestrator, and the client of
every mode; its command line (``python -m services.edge``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from aiohttp import web

from dsd.backends.factory import load_pair
from dsd.backends.hf import HfBackendConfig
from dsd.backends.synthetic import SyntheticBackendConfig
from dsd.text import target_tokenizer
from services import access, spinwait
from services.compute import add_backend_args, backend_from_args, freeze_startup_heap
from services.edge.app import Edge
from services.edge.openai_api.config import ServeConfig


log = logging.getLogger("services.edge")


def main(argv: list[str] | None = None) -> None:
    app, args = build(argv)
    freeze_startup_heap()
    # A Unix socket as well, for an orchestrator outside this process's network namespace.
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        path=args.unix_socket or None,
        print=None,
        access_log=None,
        loop=spinwait.new_event_loop(args.spin),
    )


def _edge_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.edge", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix-socket", default="", help="also serve HTTP on this Unix socket path")
    parser.add_argument("--out-dir", default="", help="where run folders go (default: a new dsd-edge-* temp folder)")
    parser.add_argument(
        "--openai-json",
        default="",
        help="serve the OpenAI-compatible API (/v1/) with these settings from the start, "
        "a JSON object of services/edge/openai_api/config.py ServeConfig's fields "
        "(verifier_url, mode, gamma, ...); else PUT /openai sets them",
    )
    parser.add_argument(
        "--shape-link",
        action="store_true",
        help="let the control API shape this edge's link from inside its network namespace "
        "(PUT /link; needs CAP_NET_ADMIN and CAP_NET_RAW here)",
    )
    add_backend_args(parser)
    access.add_access_args(parser)
    spinwait.add_spin_args(parser)
    return parser


def build(argv: list[str] | None = None) -> tuple[web.Application, argparse.Namespace]:
    """The command line -> the edge's app, its draft loaded (what main serves)."""
    parser = _edge_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    try:
        backend, profile = backend_from_args(args)
        token = access.load_token(args.token_file, log=log)
        args.spin = spinwait.spin_from_args(args)
        serve = ServeConfig.from_json(json.loads(args.openai_json)) if args.openai_json else None
    except ValueError as exc:
        parser.error(str(exc))
    access.check_host(args.host, args.allow_any_host, log)
    draft, _target = load_pair(backend)
    del _target  # the edge hosts the draft only
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="dsd-edge-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    t_draft_s = profile.t_draft_edge_s if profile and backend.emulated else 0.0
    trace = backend.trace() if isinstance(backend, SyntheticBackendConfig) else None
    edge = Edge(
        draft,
        backend.emulated,
        t_draft_s,
        out_dir,
        {
            "kind": backend.kind,
            "draft": draft.name,
            "profile": asdict(profile) if profile else None,
            "acceptance_trace": trace.summary() if trace else None,
        },
        token,
        shape_link=args.shape_link,
        spin=args.spin,
        **openai_text(backend),
    )
    log.info(
        "edge on %s:%s backend=%s out_dir=%s spin=%s",
        args.host,
        args.port,
        backend.kind,
        out_dir,
        json.dumps(asdict(args.spin)),
    )
    app = edge.app()
    if serve is not None:
        openai = edge.openai
        if openai is None:
            parser.error(f"--openai-json: the {backend.kind} backend has no tokenizer to serve text with")

        async def serve_from_start(_app) -> None:
            await openai.configure(serve)

        app.on_startup.append(serve_from_start)
    return app, args


def openai_text(backend) -> dict:
    """The tokenizer and model name the OpenAI-compatible API serves with: a pair of real models
    with a tokenizer has them (its folder's name); an emulated backend, or a pair without a
    tokenizer, has no text, and no such API."""
    if not isinstance(backend, HfBackendConfig):
        return {}
    try:
        tokenizer = target_tokenizer(backend)
    except ValueError as exc:
        log.info("no OpenAI-compatible API: %s", exc)
        return {}
    folder = Path(backend.target_path).parent if backend.target_path else Path(backend.pair_path)
    return {"tokenizer": tokenizer, "model_name": folder.expanduser().resolve().name}
