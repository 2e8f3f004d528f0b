"""A TCP tunnel onto a swarm's overlay: the swarm launcher's control container runs it when the
orchestrator is not on the manager (its Docker API is remote), so the tasks' control APIs are
reached through one published port of the manager node.

    python3 -m orchestrator.launchers.swarm_tunnel --port 8790 --allow 10.231.0.0/22

It answers HTTP ``CONNECT ip:port`` (what http.client's ``set_tunnel`` sends) with 200 and then
copies bytes both ways; a destination outside ``--allow`` (the stack's overlay subnet) gets 403,
one that does not answer within 5 s 502. It carries the testbed's own traffic only: the control
APIs behind it require the testbed's token, and it holds nothing itself.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress

CONNECT_TIMEOUT_S = 5.0
HEADER_LIMIT_BYTES = 8192


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _serve(allow: ipaddress.IPv4Network, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10.0)
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + [""]
    host, _, port = target.rpartition(":")
    try:
        allowed = method == "CONNECT" and ipaddress.ip_address(host) in allow and 0 < int(port) < 65536
    except ValueError:
        allowed = False
    if not allowed:
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        writer.close()
        return
    try:
        up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
    except (TimeoutError, OSError):
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def serve(port: int, allow: ipaddress.IPv4Network) -> None:
    server = await asyncio.start_server(lambda r, w: _serve(allow, r, w), "0.0.0.0", port, limit=HEADER_LIMIT_BYTES)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--allow", type=ipaddress.IPv4Network, required=True, help="the overlay's subnet")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.allow))


if __name__ == "__main__":
    main()
