"""The clients of one network point are given one start: far enough ahead for every edge to
connect and probe its link first, and checked afterwards against when they did start."""

import pandas as pd
import pytest

from netem.spec import LinkSpec
from orchestrator.launchers.control_api import (
    POST_LEAD_PER_CLIENT_S,
    POST_LEAD_S,
    PROBES_BEFORE_RUN,
    _start_spread,
    round_trip_ms,
    start_lead_s,
)


def test_the_lead_covers_the_slowest_links_probes_and_the_posts():
    specs = [LinkSpec(rtt_ms=20), LinkSpec(rtt_ms=240, jitter_ms=5), LinkSpec(delay_up_ms=30, delay_down_ms=50)]
    assert [round_trip_ms(s) for s in specs] == [20, 250, 80]
    lead = start_lead_s(specs, clients=16)
    assert lead == pytest.approx((PROBES_BEFORE_RUN + 2) * 0.250 + POST_LEAD_S + 16 * POST_LEAD_PER_CLIENT_S)
    assert lead > PROBES_BEFORE_RUN * 0.250 + 16 * 0.008  # five probes of the slowest link and 16 posts


def test_the_spread_is_of_each_clients_first_request():
    requests = pd.DataFrame({"client_id": [0, 0, 1, 1, 2], "t_start_s": [100.002, 100.9, 100.004, 101.5, 100.010]})
    spread = _start_spread(requests, start_at_unix_s=100.0)
    assert spread["start_spread_ms"] == pytest.approx(8.0)
    assert spread["start_late_ms"] == pytest.approx(10.0)
    assert _start_spread(requests, start_at_unix_s=0.0) == {}  # one client: no common start given
    assert _start_spread(requests.iloc[0:0], start_at_unix_s=100.0) == {}
