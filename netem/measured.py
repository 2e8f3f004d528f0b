"""Measured round trips (the CICV5G 5G data set) as link-schedule traces: pure functions and a CLI.

    samples = read_raw("urban_n78_v30_run01.txt")      # [(sent_ms, rtt_ms)], one per echo, file order
    trace = to_trace(samples)                           # [(t_s, rtt_ms)] at the raw sampling
    trace = resample(trace, step_s=0.1)                 # optional: one row per 100 ms (rule below)
    write_trace(trace, "urban_n78_v30.csv")             # header t_s,rtt_ms: LinkSchedule.from_trace_csv
    figures(trace)                                      # rows, duration_s, RTT p50/p95/p99/max

    python -m netem.measured RAW... --out-dir data/cicv5g [--resample-ms 100]

The raw format: whitespace-separated text with one header line whose first three columns are
`pub_time(ms) sub_time(ms) delay(ms)`: the vehicle's send time and echo-received time (epoch ms,
one clock) and their difference, an application-level round trip (vehicle -> 5G -> cloud -> 5G ->
vehicle). The rest of a row (pose, cell, signal) is not part of a link and is dropped.

Conversion: t_s = (pub_time - first pub_time) / 1000, rtt_ms = delay. A row says "a packet sent at
t_s took rtt_ms to come back", so the schedule holds that RTT from t_s until the next echo was sent
(about 55 ms later). A stall in the data is a run of echoes whose RTT falls by the send interval
from one to the next (all of them come back at once when the link returns); replayed with
`[link] schedule_order = "queue"` the packets held in it come out together too, as they did.

Resampling rule (`resample`): the time axis cut into bins of step_s from t_s = 0; a bin's RTT is
the LARGEST RTT of the echoes sent in it (a spike or a stall is kept, not averaged away), and a bin
no echo was sent in keeps the previous bin's RTT. Consecutive bins with the same RTT are one row.

Figures use the inverted-CDF percentile (the smallest sample with at least q of the samples at or
below it: always one of the measured values), and duration_s is last send - first send.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
from pathlib import Path

from netem.measure import percentile

RAW_COLUMNS = ("pub_time(ms)", "sub_time(ms)", "delay(ms)")
MAX_ROWS = 10_000_000


def read_raw(path: str | Path) -> list[tuple[int, int]]:
    """(sent_ms, rtt_ms) per echo, in file order. Refuses a header that is not the data set's, a
    row whose delay is not sub - pub, and a send time earlier than the one before it."""
    path = Path(path)
    lines = path.read_text().splitlines()
    header = lines[0].split() if lines else []
    if tuple(header[:3]) != RAW_COLUMNS:
        raise ValueError(f"{path}: the header must start with {' '.join(RAW_COLUMNS)}, got {header[:3]}")
    out: list[tuple[int, int]] = []
    for number, line in enumerate(lines[1 : MAX_ROWS + 1], start=2):
        if not line.strip():
            continue
        fields = line.split()
        try:
            pub_ms, sub_ms, delay_ms = (int(fields[0]), int(fields[1]), int(float(fields[2])))
        except (IndexError, ValueError):
            raise ValueError(
                f"{path}:{number}: expected pub_time sub_time delay as integers, got {line[:80]!r}"
            ) from None
        if sub_ms - pub_ms != delay_ms:
            raise ValueError(f"{path}:{number}: delay {delay_ms} ms is not sub - pub = {sub_ms - pub_ms} ms")
        if out and pub_ms < out[-1][0]:
            raise ValueError(f"{path}:{number}: send time {pub_ms} is earlier than the row before ({out[-1][0]})")
        out.append((pub_ms, delay_ms))
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def to_trace(samples: list[tuple[int, int]]) -> list[tuple[float, float]]:
    """(t_s, rtt_ms) at the raw sampling: t_s from the first send, exact to the millisecond."""
    first_ms = samples[0][0]
    return [((sent_ms - first_ms) / 1000.0, float(rtt_ms)) for sent_ms, rtt_ms in samples]


def resample(trace: list[tuple[float, float]], step_s: float) -> list[tuple[float, float]]:
    """One RTT per bin of step_s (the largest sent in it; an empty bin keeps the one before), and
    only the bins where it changes."""
    if not (isinstance(step_s, (int, float)) and math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a number of seconds > 0, got {step_s!r}")
    bins: dict[int, float] = {}
    for t_s, rtt_ms in trace:
        k = int(math.floor(t_s / step_s + 1e-9))
        bins[k] = max(bins.get(k, -math.inf), rtt_ms)
    out: list[tuple[float, float]] = []
    for k in sorted(bins):
        if not out or bins[k] != out[-1][1]:
            out.append((round(k * step_s, 9), bins[k]))
    return out


def figures(trace: list[tuple[float, float]]) -> dict:
    """What PROVENANCE-style tables give per file: rows, duration (s), RTT percentiles (ms)."""
    rtts = [rtt for _, rtt in trace]
    return {
        "rows": len(trace),
        "duration_s": trace[-1][0] - trace[0][0],
        "rtt_p50_ms": percentile(rtts, 50),
        "rtt_p95_ms": percentile(rtts, 95),
        "rtt_p99_ms": percentile(rtts, 99),
        "rtt_max_ms": max(rtts),
    }


def stalls(trace: list[tuple[float, float]], min_rtt_ms: float = 1000.0) -> list[tuple[float, float]]:
    """(t_s, rtt_ms) of each stall's first echo: an echo at or above min_rtt_ms after one below."""
    out, below = [], True
    for t_s, rtt_ms in trace:
        if rtt_ms >= min_rtt_ms and below:
            out.append((t_s, rtt_ms))
        below = rtt_ms < min_rtt_ms
    return out


def format_trace(trace: list[tuple[float, float]]) -> str:
    """The trace CSV's text: t_s to the millisecond, rtt_ms as the data gives it."""
    lines = ["t_s,rtt_ms"]
    for t_s, rtt_ms in trace:
        rtt = f"{int(rtt_ms)}" if float(rtt_ms).is_integer() else f"{rtt_ms:g}"
        lines.append(f"{t_s:.3f}".rstrip("0").rstrip(".") + f",{rtt}")
    return "\n".join(lines) + "\n"


def write_trace(trace: list[tuple[float, float]], path: str | Path) -> None:
    Path(path).write_text(format_trace(trace))


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def trace_name(raw: Path) -> str:
    """urban_n78_v30_run01.txt -> urban_n78_v30_run01.csv (the raw name kept: it says what it is)."""
    return raw.with_suffix(".csv").name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m netem.measured", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    parser.add_argument("raw", nargs="+", type=Path, help="CICV5G raw text files")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument(
        "--resample-ms",
        type=float,
        default=0.0,
        help="bin width in ms (0 = the raw sampling, the default); see the module's rule",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing trace")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for raw in args.raw:
        trace = to_trace(read_raw(raw))
        if args.resample_ms:
            trace = resample(trace, args.resample_ms / 1000.0)
        out = args.out_dir / trace_name(raw)
        if out.exists() and not args.force:
            print(f"{out} exists (--force to overwrite)", file=sys.stderr)
            return 2
        write_trace(trace, out)
        f = figures(trace)
        print(
            f"{out}: raw sha256 {sha256(raw)} rows={f['rows']} duration_s={f['duration_s']:.3f} "
            f"rtt_ms p50/p95/p99/max={f['rtt_p50_ms']:g}/{f['rtt_p95_ms']:g}/{f['rtt_p99_ms']:g}/"
            f"{f['rtt_max_ms']:g} stalls_ge_1s={len(stalls(trace))}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
