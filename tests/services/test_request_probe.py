"""The RTT an adaptive edge decides a request on: the last periodic probe only if it was sent after
the previous request ended (a probe sent while a fallen link's old packets drained is older than
that request's own round trips), and the channel records when its probe was sent."""

import time

import pytest

from services.compute import PreciseTimer
from services.edge import VerifierChannel, probe_for_request_s, ws_url
from tests.services.harness import run, synthetic_args


def test_the_first_request_is_decided_on_the_probe():
    assert probe_for_request_s(12.0, 5.0, None) == pytest.approx(0.012)


def test_a_probe_sent_after_the_previous_request_ended_decides():
    assert probe_for_request_s(12.0, 5.0, 4.9) == pytest.approx(0.012)


def test_a_probe_sent_before_the_previous_request_ended_is_left_to_the_running_estimate():
    assert probe_for_request_s(106.0, 4.9, 5.0) is None


def test_no_probe_or_no_send_time_decides_nothing():
    assert probe_for_request_s(None, None, None) is None
    assert probe_for_request_s(None, 6.0, 5.0) is None
    assert probe_for_request_s(12.0, None, 5.0) is None


@pytest.fixture(scope="module")
def verifier(spawn):
    return spawn(("services.verifier", synthetic_args()))[0]


async def probe_twice(url: str):
    channel = VerifierChannel(url, 0.0, PreciseTimer())
    await channel.connect("probe-time")
    try:
        before_s = time.perf_counter()
        rtt_ms = await channel.probe_ms()
        after_s = time.perf_counter()
        first_sent_s = channel.rtt_probe_sent_s
        await channel.probe_ms()
        return before_s, first_sent_s, after_s, rtt_ms, channel.rtt_probe_sent_s
    finally:
        await channel.close()


def test_the_link_records_when_its_last_probe_was_sent(verifier):
    before_s, first_sent_s, after_s, rtt_ms, second_sent_s = run(probe_twice(ws_url(verifier.url)))
    assert before_s <= first_sent_s <= after_s - rtt_ms / 1e3 + 1e-6
    assert second_sent_s >= after_s
