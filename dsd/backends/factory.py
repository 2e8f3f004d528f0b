"""Backends by kind: the registry, and a backend config from JSON or an experiment's table.

A backend is one config (dsd/backends/protocol.py ``BackendConfig``): a frozen dataclass per kind
that loads its (draft, target) pair. The services take it whole (``--backend-json``), the
launchers pass it on whole, an experiment's [backend] table is its fields beside ``kind``. A new
backend is a module with its config class and one line in BACKEND_CONFIGS.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from typing import Any

from dsd.backends.hf import DEFAULT_PAIR, DTYPE_NAMES, HfBackendConfig  # noqa: F401 - re-exported
from dsd.backends.protocol import BackendConfig, LanguageModel
from dsd.backends.synthetic import SyntheticBackendConfig

BACKEND_CONFIGS: dict[str, type[BackendConfig]] = {
    SyntheticBackendConfig.kind: SyntheticBackendConfig,
    HfBackendConfig.kind: HfBackendConfig,
}
DEFAULT_KIND = SyntheticBackendConfig.kind
_JSON_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def register_backend(config_class: type[BackendConfig]) -> None:
    """Add a backend kind at run time (BACKEND_CONFIGS is where the shipped ones are listed)."""
    if not config_class.kind or config_class.kind in BACKEND_CONFIGS:
        raise ValueError(f"backend kind must be new and non-empty, got {config_class.kind!r}")
    BACKEND_CONFIGS[config_class.kind] = config_class


def backend_from_dict(values: dict[str, Any], where: str = "the backend config") -> BackendConfig:
    """{"kind": KIND, FIELD: VALUE, ...} -> that kind's config; kind defaults to synthetic. A key
    the kind does not have, or a value of the wrong JSON type, is an error naming it."""
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a JSON object / table, got {values!r}")
    values = dict(values)
    kind = values.pop("kind", DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in BACKEND_CONFIGS:
        raise ValueError(f"backend kind must be one of {tuple(BACKEND_CONFIGS)}, got {kind!r}")
    config_class = BACKEND_CONFIGS[kind]
    if not is_dataclass(config_class):
        raise TypeError(f"backend kind {kind!r}: its config class is not a dataclass")
    known = {f.name: f for f in fields(config_class)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(
            f"unknown key(s) in {where}: {unknown} (backend kind {kind!r}); known: {sorted(known) + ['kind']}"
        )
    for name, value in values.items():
        declared = known[name].type  # a string under `from __future__ import annotations`
        types = _JSON_TYPES.get(declared if isinstance(declared, str) else getattr(declared, "__name__", ""))
        if types is not None and (not isinstance(value, types) or (bool not in types and isinstance(value, bool))):
            raise ValueError(f"backend.{name} must be a JSON {types[-1].__name__}, got {value!r}")
    return config_class(**values)


def backend_from_json(text: str) -> BackendConfig:
    """The services' --backend-json; empty: the default (synthetic) backend."""
    if not text:
        return BACKEND_CONFIGS[DEFAULT_KIND]()
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--backend-json is not valid JSON: {error}") from None
    return backend_from_dict(values, where="--backend-json")


def load_pair(config: BackendConfig) -> tuple[LanguageModel, LanguageModel]:
    """Returns (draft, target), both LanguageModels."""
    return config.load()
