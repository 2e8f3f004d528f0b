"""A model pair folder's manifest: what the build wrote and what a backend checks before loading.

The pair builds (the `pairs` package) write manifest.json with every file's hash; `verify_pair`
re-hashes the folder before anyone loads it. Standard library only: the decoding core checks a
pair without importing the training stack.

Folder layout:

    tokenizer.json, tokenizer_config.json   shared by both models
    target/, draft/                         save_pretrained folders (config, safetensors)
    manifest.json
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "dsd-pair/1"
# What the draft is: a causal LM over tokens (its own layers), or a feature draft that reads the
# target's features (dsd.backends.eagle_lm); a manifest without the field carries the first.
DRAFT_KINDS = ("causal_lm", "eagle")


def draft_kind(manifest: dict[str, Any]) -> str:
    kind: str = manifest.get("draft_kind", DRAFT_KINDS[0])
    if kind not in DRAFT_KINDS:
        raise PairIntegrityError(f"manifest draft_kind {kind!r}: expected one of {DRAFT_KINDS}")
    return kind


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hash_tree(folder: Path) -> dict[str, dict[str, Any]]:
    """Every file under folder except the manifest, by POSIX relative path."""
    return {
        p.relative_to(folder).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    manifest = {**manifest, "files": hash_tree(folder)}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


class PairIntegrityError(RuntimeError):
    """The pair folder differs from what its manifest recorded."""


def verify_pair(folder: Path | str) -> dict[str, Any]:
    """Re-hash every file the manifest lists; raise PairIntegrityError naming each missing,
    changed or unlisted file. Returns the manifest."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise PairIntegrityError(f"{manifest_path}: missing; not a built pair folder")
    manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise PairIntegrityError(f"{manifest_path}: format {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    expected, problems = manifest["files"], []
    actual = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST}
    for relpath, entry in sorted(expected.items()):
        path = folder / relpath
        if not path.is_file():
            problems.append(f"missing: {relpath}")
        elif sha256_file(path) != entry["sha256"]:
            problems.append(f"sha256 mismatch: {relpath}")
    # An unlisted file may change what from_pretrained loads (e.g. a stray weights index).
    problems += [f"not in manifest: {p}" for p in sorted(actual - set(expected))]
    if problems:
        raise PairIntegrityError(f"{folder}: " + "; ".join(problems))
    return manifest
