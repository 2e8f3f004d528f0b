"""A link schedule's run on one time axis: the RTT the schedule (or a replayed trace) set, and each
request's per-token latency where it ran, in seconds since its point's link started.

Network launchers: a request's start is its ``t_start_s`` (the edge's epoch seconds) less the point's
schedule start (links.csv: each change's ``change_t_unix_s - change_at_s``). The sim launcher keeps
no clock, but runs a point's requests back to back from the schedule's start, so a request starts
where the ones before it ended.
"""

from __future__ import annotations

import pandas as pd

COLUMNS = ["point", "mode", "gamma", "t_s", "wall_s", "per_token_ms"]


def schedule_rtt_ms(experiment: dict) -> list[tuple[float, float]]:
    """(t_s, rtt_ms) of the link from sweep.json's experiment record: its first RTT from 0, then each
    step of its schedule that sets the RTT; empty without a schedule (or with several RTTs, whose
    points each start the schedule from their own)."""
    steps = ((experiment.get("link") or {}).get("schedule") or {}).get("steps") or []
    if not steps or len(experiment.get("rtt_ms", [])) != 1:
        return []
    out = [(0.0, float(experiment["rtt_ms"][0]))]
    for step in steps:
        rtt = dict((key, value) for key, value in step["changes"]).get("rtt_ms")
        if rtt is not None:
            out.append((float(step["at_s"]), float(rtt)))
    return out


def request_times(requests: pd.DataFrame, links: pd.DataFrame, warmup_requests: int) -> pd.DataFrame:
    """Per request: point, mode, gamma, ``t_s`` (its start since its point's link started),
    ``wall_s`` and ``per_token_ms`` (its wall time over its tokens: what its user waited per token,
    the first token's wait and any stall included). Requests that cannot be placed are left out: a
    network point with no change of its schedule in links.csv, and every sim request after warm-up
    requests (their rows are dropped, and with them where the first kept request started)."""
    rows = requests[requests["tokens"] > 0].copy()
    if "t_start_s" not in rows or rows["t_start_s"].isna().any():
        if warmup_requests:
            return pd.DataFrame(columns=COLUMNS)
        rows = rows.sort_values(["point", "request_index"])  # the sim: back to back from the start
        rows["t_s"] = rows.groupby("point")["wall_s"].cumsum() - rows["wall_s"]
    else:
        changes = links[links["change_index"].fillna(0) > 0] if "change_index" in links else links.iloc[0:0]
        if changes.empty:
            return pd.DataFrame(columns=COLUMNS)
        start = (changes["change_t_unix_s"] - changes["change_at_s"]).groupby(changes["point"]).min()
        rows = rows[rows["point"].isin(start.index)]
        rows["t_s"] = rows["t_start_s"] - rows["point"].map(start)
    rows["per_token_ms"] = 1000.0 * rows["wall_s"] / rows["tokens"]
    return rows[COLUMNS].reset_index(drop=True)
