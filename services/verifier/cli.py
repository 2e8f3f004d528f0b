"""The verifier service (the cloud): the target, and the draft for co-located SD, behind /ws;
its command line (``python -m services.verifier``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict

import torch
from aiohttp import web

from dsd.backends.factory import load_pair
from services import access, frames, spinwait
from services.compute import add_backend_args, backend_from_args, freeze_startup_heap, make_device
from dsd.drive.batching import BatchingConfig
from services.verifier.scheduler import Scheduler
from services.verifier.http import VERIFIER_KEY
from services.verifier.limits import VerifierLimits
from services.verifier.server import Verifier


log = logging.getLogger("services.verifier")


def main(argv: list[str] | None = None) -> None:
    app, args = build(argv)
    freeze_startup_heap()
    # A Unix socket as well, for an orchestrator outside this process's network namespace.
    # The TCP port serves HTTP (/ws among it) and the frame transport (services/frames.py).
    frames.run_app(
        app,
        args.host,
        args.port,
        args.unix_socket or None,
        app[VERIFIER_KEY].frame_protocol,
        spinwait.new_event_loop(args.spin),
    )


def _verifier_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m services.verifier", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--host", default="127.0.0.1", help="listen address: 127.0.0.1 or the testbed address (see --allow-any-host)"
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--unix-socket", default="", help="also serve HTTP on this Unix socket path")
    add_backend_args(parser)
    access.add_access_args(parser)
    spinwait.add_spin_args(parser)
    limits_defaults = VerifierLimits()
    parser.add_argument("--max-batch", type=int, default=1)
    parser.add_argument("--batch-window-ms", type=float, default=0.0)
    parser.add_argument("--max-sessions", type=int, default=limits_defaults.max_sessions)
    parser.add_argument("--max-gamma", type=int, default=limits_defaults.max_gamma)
    parser.add_argument("--max-tokens-per-session", type=int, default=limits_defaults.max_tokens_per_session)
    parser.add_argument("--max-message-bytes", type=int, default=limits_defaults.max_message_bytes)
    parser.add_argument("--idle-timeout-s", type=float, default=limits_defaults.idle_timeout_s)
    parser.add_argument(
        "--tcp-rto-max-ms",
        type=int,
        default=limits_defaults.tcp_rto_max_ms,
        help="cap TCP's retransmission backoff per connection (0: the kernel's; Linux >= 6.15)",
    )
    for name in (
        "max_sessions_per_connection",
        "max_inflight_per_connection",
        "max_prompt_tokens",
        "max_tokens_per_connection",
    ):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(limits_defaults, name))
    return parser


def build(argv: list[str] | None = None) -> tuple[web.Application, argparse.Namespace]:
    """The command line -> the verifier's app, its backend loaded (what main serves)."""
    parser = _verifier_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    try:
        backend, profile = backend_from_args(args)
        limits = VerifierLimits(
            args.max_sessions,
            args.max_gamma,
            args.max_tokens_per_session,
            args.max_message_bytes,
            args.idle_timeout_s,
            args.max_sessions_per_connection,
            args.max_inflight_per_connection,
            args.max_prompt_tokens,
            args.max_tokens_per_connection,
            tcp_rto_max_ms=args.tcp_rto_max_ms,
        )
        scheduler_config = BatchingConfig(args.max_batch, args.batch_window_ms)
        token = access.load_token(args.token_file, log=log)
        args.spin = spinwait.spin_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    access.check_host(args.host, args.allow_any_host, log)
    draft, target = load_pair(backend)
    device = make_device(backend)
    backend_info = {
        "kind": backend.kind,
        "target": target.name,
        "draft": draft.name,
        "profile": asdict(profile) if profile else None,
    }
    verifier = Verifier(
        draft, target, device, Scheduler(scheduler_config, device, profile), limits, backend_info, token, args.spin
    )
    log.info(
        "verifier on %s:%s backend=%s token=%s limits=%s scheduler=%s spin=%s",
        args.host,
        args.port,
        backend.kind,
        "required" if token else "none",
        json.dumps(asdict(limits)),
        json.dumps(asdict(scheduler_config)),
        json.dumps(asdict(args.spin)),
    )
    return verifier.app(), args
