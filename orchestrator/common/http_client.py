"""Small blocking HTTP calls to the services, over TCP or a Unix socket.

A service inside a network namespace is out of the host's reach over IP (the namespaces have no
route to the host), but a Unix socket lives in the file system and crosses namespaces; so the
control API of a service in a namespace is addressed as ``unix:/path/to.sock`` + the HTTP path.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse

from services.access import bearer_header


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


class _NetnsConnection(http.client.HTTPConnection):
    """TCP from inside another network namespace (a container on a Swarm overlay that the host
    has no route into): the socket is made there, used from here."""

    def __init__(self, netns: str, host: str, port: int | None, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.netns = netns

    def connect(self) -> None:
        from netem.nsutil import socket_in_netns

        self.sock = socket_in_netns(self.netns, socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect((self.host, self.port))


def split_url(url: str) -> tuple[http.client.HTTPConnection, str]:
    """(connection, path) for http://host:port/path, unix:/socket/path.sock/http/path,
    netns:/proc/PID/ns/net;http://host:port/path (TCP from inside that network namespace), or
    tunnel:HOST:PORT;http://host:port/path (through an HTTP CONNECT tunnel at HOST:PORT:
    orchestrator/launchers/swarm_tunnel.py, onto a swarm's overlay from off the manager)."""
    if url.startswith("tunnel:"):
        proxy, _, rest = url[len("tunnel:") :].partition(";")
        proxy_host, _, proxy_port = proxy.rpartition(":")
        parsed = urllib.parse.urlsplit(rest)
        connection = http.client.HTTPConnection(proxy_host, int(proxy_port), timeout=10.0)
        connection.set_tunnel(parsed.hostname, parsed.port)
        return connection, (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    if url.startswith("netns:"):
        netns, _, rest = url[len("netns:") :].partition(";")
        parsed = urllib.parse.urlsplit(rest)
        return (
            _NetnsConnection(netns, parsed.hostname, parsed.port, 10.0),
            (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else ""),
        )
    if url.startswith("unix:"):
        rest = url[len("unix:") :]
        socket_path, _, path = rest.partition(".sock")
        return _UnixConnection(socket_path + ".sock", 10.0), path or "/"
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10.0)
    return connection, (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")


def request(
    method: str, url: str, body: dict | None = None, timeout_s: float = 10.0, token: str | None = None
) -> tuple[int, bytes]:
    """``token``: sent as a bearer token (a service started with the testbed's token requires it)."""
    connection, path = split_url(url)
    connection.timeout = timeout_s
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        headers.update(bearer_header(token))
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def call(method: str, url: str, body: dict | None = None, timeout_s: float = 10.0, token: str | None = None) -> bytes:
    """A request that must succeed (2xx); otherwise a RuntimeError with the service's answer."""
    status, data = request(method, url, body, timeout_s, token)
    if not 200 <= status < 300:
        raise RuntimeError(f"{method} {url}: HTTP {status}: {data.decode(errors='replace')[:500]}")
    return data
