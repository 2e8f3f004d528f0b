"""What every report figure shares: the file backend (no display), a mode's colour and label
from the mode registry, and a figure's footnote, layout and file."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dsd.modes import get_mode  # noqa: E402


def mode_color(mode: str) -> str:
    return get_mode(mode).color


def mode_label(mode: str) -> str:
    return get_mode(mode).label


def save_figure(fig, path: Path, note: str, top: float = 1.0, bottom: float = 0.03) -> Path:
    """A figure's footnote, layout and file."""
    fig.text(0.01, 0.01, note, fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, bottom, 1, top))
    # A legend beside the axes or a long title or footnote can pass the canvas: the saved area
    # grows to hold every artist instead of clipping them.
    fig.savefig(path, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path
