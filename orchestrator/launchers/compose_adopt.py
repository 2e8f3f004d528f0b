"""Adopting a compose project that is already up: every setting in which its running services
differ from what the experiment asks for, read from the containers' commands, and the
`docker compose up` that fixes them (the launcher: orchestrator/launchers/compose.py).

``config`` below is a ``ComposeConfig``: what is read of it is ``compose_env()``,
``container_backend``, ``backend``, ``profile``, ``profile_json`` and ``project``.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict

from dsd.backends.factory import BackendConfig, backend_from_json
from dsd.costs.profiles import HardwareProfile, get_profile

VERIFIER_SERVICE, EDGE_SERVICE = "verifier", "edge"  # compose.yaml's services

# compose.yaml's defaults for the variables a user sets by hand (`DSD_PROFILE=... docker compose
# up`); tests/compose/test_compose_config.py reads them back from the file.
COMPOSE_DEFAULTS = {
    "DSD_BACKEND_JSON": "",
    "DSD_PROFILE": "toy-edge-cloud",
    "DSD_PROFILE_JSON": "",
    "DSD_THREADS": "1",
    "DSD_MAX_BATCH": "1",
    "DSD_BATCH_WINDOW_MS": "0",
    "DSD_MAX_SESSIONS": "256",
}
# What an adopted project must match: (setting, the services' flag in compose.yaml's commands,
# compose.yaml's variable, verifier only). The backend (--backend-json, field by field) and the
# profile (by its numbers: a name or a JSON copy of the same profile is the same) are compared apart.
ADOPT_SETTINGS = (
    ("threads", "threads", "DSD_THREADS", False),
    ("max_batch", "max-batch", "DSD_MAX_BATCH", True),
    ("batch_window_ms", "batch-window-ms", "DSD_BATCH_WINDOW_MS", True),
    ("max_sessions", "max-sessions", "DSD_MAX_SESSIONS", True),
)


def _command_flags(container) -> dict[str, str]:
    """compose.yaml writes every service flag as --name=value: {name: value}."""
    flags = {}
    for item in container.attrs.get("Config", {}).get("Cmd") or []:
        if item.startswith("--") and "=" in item:
            name, _, value = item[2:].partition("=")
            flags[name] = value
    return flags


def _backend_differences(running_json: str, wanted: BackendConfig) -> list[tuple[str, object, object]]:
    """(setting, running value, wanted value) for each field in which a service's --backend-json
    differs from the wanted backend; empty when they are the same backend."""
    try:
        running = backend_from_json(running_json).to_dict()
    except ValueError:
        return [("backend", running_json, wanted.to_json())]
    if running["kind"] != wanted.kind:
        return [("backend.kind", running["kind"], wanted.kind)]
    return [(f"backend.{key}", running[key], value) for key, value in wanted.to_dict().items() if running[key] != value]


def _same(running: str | None, wanted: str) -> bool:
    if running is None:
        return False
    try:
        return float(running) == float(wanted)
    except ValueError:
        return running == wanted


def _profile_numbers(profile: HardwareProfile) -> dict:
    return {k: v for k, v in asdict(profile).items() if k not in ("name", "sources")}


def _running_profile(flags: dict[str, str]) -> tuple[str, dict | None]:
    """(its name as shown, its numbers or None when unknown) from a service's flags."""
    try:
        if flags.get("profile-json"):
            values = json.loads(flags["profile-json"])
            return values.get("name", "?"), _profile_numbers(HardwareProfile(**values))
        if flags.get("profile"):
            return flags["profile"], _profile_numbers(get_profile(flags["profile"]))
    except (ValueError, TypeError, KeyError):
        return flags.get("profile") or "?", None
    return "(none)", None


def adopt_mismatches(config, verifier, edges: list) -> list[tuple[tuple[str, ...], str]]:
    """Every setting in which a running project's services differ from the config: (compose.yaml's
    variables that set it, "SETTING: running VALUE (CONTAINER), the experiment's VALUE")."""
    wanted = config.compose_env()
    problems = []
    services = [x for x in [verifier, *edges] if x is not None]
    flags = {x.name: _command_flags(x) for x in services}
    for x in services:
        differences = _backend_differences(flags[x.name].get("backend-json", ""), config.container_backend)
        if differences:
            problems += [
                (("DSD_BACKEND_JSON",), f"{setting}: running {running!r} ({x.name}), the experiment's {value!r}")
                for setting, running, value in differences
            ]
            break
    for setting, flag, variable, verifier_only in ADOPT_SETTINGS:
        for x in services[:1] if verifier_only else services:
            running = flags[x.name].get(flag)
            if not _same(running, wanted[variable]):
                problems.append(
                    ((variable,), f"{setting}: running {running!r} ({x.name}), the experiment's {wanted[variable]!r}")
                )
                break
    if config.backend.emulated and config.profile is not None:
        for x in services:
            name, numbers = _running_profile(flags[x.name])
            if numbers != _profile_numbers(config.profile):
                problems.append(
                    (
                        ("DSD_PROFILE", "DSD_PROFILE_JSON"),
                        f"profile: running {name!r} ({x.name}), the experiment's {config.profile.name!r}",
                    )
                )
                break
    return problems


def fix_command(config, n_edges: int, also=()) -> str:
    """The `docker compose up` that starts the project as the config wants it: the variables that
    differ from compose.yaml's defaults, and those named in `also` (a value found wrong may have
    come from the user's shell, which a default would not override)."""
    env = config.compose_env()
    wanted = {}
    if "DSD_BACKEND_JSON" in also or _backend_differences("", config.container_backend):
        wanted["DSD_BACKEND_JSON"] = env["DSD_BACKEND_JSON"]  # else compose.yaml's default is it
    wanted.update({variable: env[variable] for _, _, variable, _ in ADOPT_SETTINGS})
    if config.backend.emulated and config.profile is not None:
        try:
            named = _profile_numbers(get_profile(config.profile.name)) == _profile_numbers(config.profile)
        except (KeyError, ValueError):
            named = False
        if named:
            wanted["DSD_PROFILE"] = config.profile.name
        else:
            wanted.update({"DSD_PROFILE": "", "DSD_PROFILE_JSON": config.profile_json})
    parts = [
        f"{k}={shlex.quote(v)}"
        for k, v in wanted.items()
        if k in also or k == "DSD_BACKEND_JSON" or not _same(v, COMPOSE_DEFAULTS[k])
    ]
    project = [] if config.project == "dsdbed" else ["-p", config.project]
    return " ".join(
        [*parts, "docker", "compose", *project, "up", "-d", "--scale", f"{EDGE_SERVICE}={n_edges}", "--wait"]
    )
