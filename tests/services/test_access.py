"""Who may talk to the verifier: it listens on loopback by default and warns about a wildcard
address unless told the namespace is the testbed's own; with a token, sessions and /metrics need
it (health stays open), a refusal is a structured 401 that allocates nothing, and the edge sends
the token; nothing received is unpickled."""

import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import msgpack
import pytest

from dsd.backends.factory import SyntheticBackendConfig
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar
from dsd.costs.profiles import HardwareProfile
from dsd.speculation.stopping import StopRule
from orchestrator.launchers.loopback import LoopbackTestbed
from orchestrator.launchers.services_config import ServicesConfig
from services import access, wire
from services.launch import REPO, free_port
from tests.services.harness import TEST_PROFILE, RawClient, post_runs, read_csv, run, synthetic_args, wait_for_runs

ALPHA, SEED = 0.7, 3
TOKEN = "test-token-" + "x" * 24


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def guarded(spawn, token_file, tmp_path_factory):
    """A verifier that requires the token, an edge that has it and an edge that has not."""
    out = tmp_path_factory.mktemp("edges")
    verifier, edge, bare_edge = spawn(
        ("services.verifier", synthetic_args(ALPHA, SEED) + ["--token-file", str(token_file)]),
        ("services.edge", synthetic_args(ALPHA, SEED) + ["--token-file", str(token_file), "--out-dir", str(out / "a")]),
        ("services.edge", synthetic_args(ALPHA, SEED) + ["--out-dir", str(out / "b")]),
    )
    edge.token = TOKEN  # its control API requires the token it was started with
    return verifier, edge, bare_edge


def http_status(url: str, headers: dict) -> tuple[int, dict]:
    async def get():
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
            return response.status, await response.json()

    return run(get())


async def handshake(url: str, token: str | None):
    """The WebSocket upgrade's answer: a Welcome, or the HTTP status and body of a refusal."""
    headers = access.bearer_header(token)
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(url.replace("http://", "ws://") + "/ws", headers=headers)
        except aiohttp.WSServerHandshakeError as exc:
            async with http.get(url + "/ws", headers=headers) as response:  # the body of the refusal
                return exc.status, await response.json()
        async with ws:
            await ws.send_bytes(wire.encode(wire.Hello(1, "probe")))
            return 101, wire.decode((await ws.receive(timeout=10)).data)


def test_sessions_and_metrics_need_the_token_and_health_stays_open(guarded):
    verifier = guarded[0]
    before = verifier.get_json("/health")
    assert before["status"] == "ok"  # no token needed
    for token in (None, "wrong-token-" + "y" * 20, TOKEN[:-1]):
        status, body = run(handshake(verifier.url, token))
        assert status == 401, (token, body)
        assert body["code"] == wire.UNAUTHORIZED and body["field"] == "Authorization" and body["message"]
        status, body = http_status(verifier.url + "/metrics", access.bearer_header(token))
        assert status == 401 and body["code"] == wire.UNAUTHORIZED
    status, welcome = run(handshake(verifier.url, TOKEN))
    assert status == 101 and isinstance(welcome, wire.Welcome)
    verifier.token = TOKEN
    metrics = verifier.get_json("/metrics")
    assert metrics["token_required"] is True
    # Refused upgrades allocated nothing: only the one accepted connection was ever counted.
    assert metrics["connections_total"] == 1 and metrics["sessions_total"] == 0
    assert metrics["errors"]["unauthorized"] == 9  # 3 tokens x (upgrade, its body, /metrics)
    assert "refused GET /ws" in verifier.log() and "wrong token" in verifier.log()


def test_an_edge_with_the_token_runs_and_one_without_is_refused(guarded):
    verifier, edge, bare_edge = guarded
    prompts = [[5, 6, 7], [9, 1]]
    body = {
        "mode": "sync",
        "gamma": 3,
        "prompts": prompts,
        "max_new_tokens": 24,
        "verifier_url": verifier.url,
        "probe_count": 1,
    }
    good = post_runs(edge, [{**body, "run_id": "with-token", "client_id": "a"}])
    bad = post_runs(bare_edge, [{**body, "run_id": "without-token", "client_id": "b"}])
    refused = wait_for_runs(bare_edge, bad)["without-token"]
    assert refused["status"] == "failed" and "HTTP 401" in refused["error"], refused
    assert wait_for_runs(edge, good)["with-token"]["status"] == "done"
    target = SyntheticLM(SyntheticConfig(alpha=ALPHA, seed=SEED), "target")
    stop = StopRule(24, target.eos_token_id)
    for row in read_csv(edge, "with-token", "requests.csv"):
        expected = generate_ar(target, prompts[int(row["request_index"])], stop).tokens
        assert [int(t) for t in row["token_ids"].split()] == expected
    verifier.token = TOKEN
    assert verifier.get_json("/metrics")["sessions_open"] == 0


def test_a_token_is_read_from_the_file_or_the_environment_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "t"
    path.write_text(TOKEN)
    assert access.load_token(str(path), environ={}) == TOKEN
    assert access.load_token("", environ={access.TOKEN_ENV: TOKEN + "\n"}) == TOKEN
    assert access.load_token("", environ={}) is None
    path.write_text("short")
    with pytest.raises(ValueError, match="--token-file.*at least 16"):
        access.load_token(str(path), environ={})
    with pytest.raises(ValueError, match="DSD_TOKEN.*printable"):
        access.load_token("", environ={access.TOKEN_ENV: "has a space in it, sixteen+"})
    with pytest.raises(ValueError, match="--token-file.*No such file"):
        access.load_token(str(tmp_path / "missing"), environ={})
    assert access.bearer_matches(f"Bearer {TOKEN}", TOKEN) and access.bearer_matches(f"bearer {TOKEN}", TOKEN)
    assert not access.bearer_matches(TOKEN, TOKEN) and not access.bearer_matches(None, TOKEN)


# ---- where it listens ----------------------------------------------------------------------


def listening_addresses(pid: int) -> set[str]:
    """Local addresses of the process's listening TCP sockets, from /proc (hex address:port)."""
    inodes = {
        os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1]
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
    }
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.add(cols[1])
    return found


def start_verifier(extra: list[str], log_path: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.verifier", *synthetic_args(ALPHA, SEED), *extra],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )


def wait_listening(process: subprocess.Popen, log_path: Path, timeout_s: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log_path.read_text()
        if "verifier on" in log_path.read_text() and (found := listening_addresses(process.pid)):
            return found
        time.sleep(0.1)
    raise TimeoutError(log_path.read_text())


def test_the_default_is_loopback_and_a_wildcard_address_is_warned_about_unless_allowed(tmp_path, token_file):
    # The wildcard cases carry the token, so nothing can use them while they listen.
    cases = {
        "default": ["--port", str(free_port())],
        "wildcard": ["--host", "0.0.0.0", "--port", str(free_port()), "--token-file", str(token_file)],
        "allowed": [
            "--host",
            "0.0.0.0",
            "--allow-any-host",
            "--port",
            str(free_port()),
            "--token-file",
            str(token_file),
        ],
    }
    processes = {name: start_verifier(args, tmp_path / f"{name}.log") for name, args in cases.items()}
    try:
        found = {name: wait_listening(p, tmp_path / f"{name}.log") for name, p in processes.items()}
    finally:
        for p in processes.values():
            os.killpg(p.pid, 15)
        for p in processes.values():
            p.wait(10)
    port = lambda name: f"{int(cases[name][cases[name].index('--port') + 1]):04X}"  # noqa: E731
    assert found["default"] == {f"0100007F:{port('default')}"}  # 127.0.0.1 only
    assert found["wildcard"] == {f"00000000:{port('wildcard')}"}
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in cases}
    assert "every interface" in logs["wildcard"] and "--allow-any-host" in logs["wildcard"]
    assert "every interface" not in logs["allowed"] and "every interface" not in logs["default"]


def test_compose_yaml_allows_the_wildcard_only_with_its_reason_and_passes_the_token():
    text = (REPO / "compose.yaml").read_text()
    assert text.count("--host=0.0.0.0") == text.count("--allow-any-host") == 2
    assert "internal testbed network" in text and "DSD_TOKEN: ${DSD_TOKEN:-}" in text


# ---- nothing received is unpickled ---------------------------------------------------------


class Canary:
    """Unpickling this creates a file: proof that someone unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


async def send_pickles(url, frames):
    async with RawClient(url, TOKEN) as c:
        replies = []
        for frame in frames:
            await c.send(frame)
            replies.append(await c.receive())
        replies.append(await c.ask(wire.Ping(99, 0.0)))
        return replies


def test_pickled_and_extension_payloads_are_refused_and_never_unpickled(guarded, tmp_path):
    verifier = guarded[0]
    canary = tmp_path / "unpickled"
    payload = pickle.dumps(Canary(canary))
    hello = {"v": 1, "type": "Hello", "seq": 5}
    frames = [
        payload,  # a bare pickle
        msgpack.packb({**hello, "client_id": payload}),  # a pickle where text belongs
        msgpack.packb({**hello, "client_id": msgpack.ExtType(7, payload)}),
        msgpack.packb({**hello, "client_id": msgpack.Timestamp(1, 0)}),
    ]
    replies = run(send_pickles(verifier.url, frames))
    assert [(r.code, r.field) for r in replies[:4]] == [
        (wire.MALFORMED, None),
        (wire.BAD_FIELD, "client_id"),
        (wire.MALFORMED, None),
        (wire.BAD_FIELD, "client_id"),
    ]
    assert "extension type 7" in replies[2].message
    assert isinstance(replies[4], wire.Pong)
    assert not canary.exists()
    with pytest.raises(wire.WireError):  # and the decoder alone, in this process
        wire.decode(payload)
    assert not canary.exists()


def test_the_loopback_launcher_gives_its_testbed_a_private_token(tmp_path):
    profile = HardwareProfile(**TEST_PROFILE)
    config = ServicesConfig(SyntheticBackendConfig(alpha=ALPHA, seed=SEED), profile, n_edges=1, work_dir=str(tmp_path))
    with LoopbackTestbed(config) as testbed:
        token_path = tmp_path / "token"
        assert token_path.stat().st_mode & 0o777 == 0o600
        token = token_path.read_text()
        url = testbed.verifier_url.replace("ws://", "http://").removesuffix("/ws")
        assert run(handshake(url, None))[0] == 401
        assert run(handshake(url, token))[0] == 101
        body = {
            "run_id": "r",
            "client_id": "c",
            "mode": "sync",
            "gamma": 2,
            "prompts": [[1, 2]],
            "max_new_tokens": 8,
            "verifier_url": testbed.verifier_url,
            "probe_count": 0,
        }

        async def post(headers):
            async with (
                aiohttp.ClientSession() as http,
                http.post(testbed.edges[0].control_url + "/runs", json=body, headers=headers) as response,
            ):
                return response.status

        # The edges' control API wants the same token: a run names the verifier the edge dials.
        assert testbed.edges[0].token == token and token not in repr(testbed.edges[0])
        assert run(post({})) == 401
        assert run(post(access.bearer_header("wrong-token-" + "z" * 20))) == 401
        assert http_status(testbed.edges[0].control_url + "/health", {})[0] == 200
        assert run(post(access.bearer_header(token))) == 201
        assert http_status(testbed.edges[0].control_url + "/runs/r", {})[0] == 401
        deadline = time.monotonic() + 30
        auth = access.bearer_header(token)
        while (state := http_status(testbed.edges[0].control_url + "/runs/r", auth)[1])["status"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert state["status"] == "done", state
