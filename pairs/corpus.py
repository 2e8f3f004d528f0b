"""The training corpus of the default model pair: the Python standard library's own sources.

It is on every machine that runs the project, needs no download and has a known licence. Its
content depends on the Python version, so the build records its size and hash.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from pairs.common import is_heldout


@dataclass(frozen=True)
class Document:
    relpath: str  # POSIX path relative to the stdlib folder: the document's stable name
    text: str


@dataclass(frozen=True)
class Corpus:
    train: tuple[Document, ...]  # sorted by relpath
    heldout: tuple[Document, ...]  # sorted by relpath
    description: dict  # plain data for the manifest


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def shuffle_key(relpath: str, seed: int) -> str:
    """A seeded, platform-independent order over documents (Python's hash() is salted)."""
    return hashlib.sha256(f"{seed}:{relpath}".encode()).hexdigest()


def list_sources(root: Path) -> list[Path]:
    # site-packages lives inside the stdlib folder but holds third-party code that differs
    # between machines.
    # Sorted by path components, spelled out so that the order (and the corpus hash) does not
    # depend on how a Python version compares Path objects.
    paths = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).parts)
    return [p for p in paths if "site-packages" not in p.relative_to(root).parts and p.is_file()]


def read_corpus(root: Path, heldout_pct: float) -> Corpus:
    """Read every source in sorted path order; files that are not UTF-8 (a few test fixtures on
    purpose) are skipped and counted."""
    digest = hashlib.sha256()
    train, heldout, skipped = [], [], []
    for path in list_sources(root):
        relpath = path.relative_to(root).as_posix()
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(relpath)
            continue
        digest.update(relpath.encode() + b"\0" + hashlib.sha256(raw).digest())
        # by a hash of the path, not of the content: a file stays on its side across Python patch releases
        (heldout if is_heldout(relpath, heldout_pct) else train).append(Document(relpath, text))
    description = {
        "source": "Python standard library *.py (site-packages excluded), sorted by path",
        "stdlib_dir": str(root),
        "heldout_rule": f"sha256(relpath)[:4] % 10000 < {heldout_pct} * 100",
        "files_train": len(train),
        "files_heldout": len(heldout),
        "files_skipped_not_utf8": skipped,
        "chars_train": sum(len(d.text) for d in train),
        "chars_heldout": sum(len(d.text) for d in heldout),
        "sha256": digest.hexdigest(),
    }
    return Corpus(tuple(train), tuple(heldout), description)


def take_chars(docs: tuple[Document, ...], n_chars: int, seed: int) -> list[str]:
    """A seeded sample of whole documents worth about n_chars: it covers all of the stdlib's
    packages instead of the alphabetically first ones, and costs less to tokenize than all."""
    picked, total = [], 0
    for doc in sorted(docs, key=lambda d: shuffle_key(d.relpath, seed)):
        if total >= n_chars:
            break
        picked.append(doc.text)
        total += len(doc.text)
    return picked
