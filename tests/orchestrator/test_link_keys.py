"""The link's experiment keys: validated up front with one line naming the key, swept like rtt_ms,
and carried into each point's key, its LinkSpec and points.csv."""

import math

import pandas as pd
import pytest

from netem.spec import LinkSpec
from orchestrator.links import keys as link_keys
from orchestrator.links import rows as link_rows
from orchestrator.analysis import wire as wire_prediction
from orchestrator.links.scheduled_point import ScheduledPoint
from orchestrator.spec.experiment import experiment_from_dict
from orchestrator.spec.plan import Point, plan_points
from tests.checks import every

BASE = {
    "name": "t",
    "profile": "toy-edge-cloud",
    "backend": {"kind": "synthetic"},
    "modes": ["sync"],
    "rtt_ms": [20, 40],
}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"loss_pct": [-1]}, r"'loss_pct'.*-1"),
        ({"loss_pct": [100]}, r"'loss_pct'.*100"),
        ({"delay_distribution": "lognormal"}, r"'delay_distribution'.*lognormal"),
        ({"jitter_ms": [15]}, r"'jitter_ms'.*one-way delay"),  # rtt 20 -> 10 ms each way
        ({"jitter_ms": [1, 1]}, r"'jitter_ms'.*repeated"),
        ({"correlation_pct": [100]}, r"'correlation_pct'"),
        ({"rate_mbit": [-10]}, r"'rate_mbit'"),
        ({"rate_mbit": ["10mbit"]}, r"'rate_mbit'"),
        ({"rtt_ms": None, "delay_up_ms": [5]}, r"'delay_down_ms'.*together"),
        ({"delay_up_ms": [5], "delay_down_ms": [5]}, r"rtt_ms or delay_up_ms/delay_down_ms, not both"),
        ({"link_loss": [1]}, r"unknown key.*link_loss"),
    ],
)
def test_bad_link_keys_fail_in_one_line_naming_the_key(change, message):
    data = {**BASE, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ValueError, match=message) as info:
        experiment_from_dict(data)
    assert "\n" not in str(info.value)


def test_link_keys_sweep_as_a_product_and_name_their_points():
    experiment = experiment_from_dict(
        {
            **BASE,
            "jitter_ms": [0, 4],
            "loss_pct": [0, 1],
            "delay_distribution": "normal",
            "rate_mbit": 10,
            "correlation_pct": 25,
        }
    )
    points = plan_points(experiment)
    assert len(points) == 2 * 2 * 2
    assert points[0].key == "sync_rtt20ms_j0ms_normal_corr25_loss0_rate10mbit_g4_c1_r0"
    assert len({p.key for p in points}) == len(points)
    spec = link_keys.point_spec(points[-1])
    assert spec == LinkSpec(rtt_ms=40, jitter_ms=4, loss_pct=1, rate_mbit=10, correlation_pct=25, distribution="normal")


def test_default_link_keys_leave_point_keys_as_they_were():
    """Sweep folders written before the link keys existed must still resume."""
    point = plan_points(experiment_from_dict(BASE))[0]
    assert point.key == "sync_rtt20ms_g4_c1_r0"
    # The sampling setting is a column of every row (orchestrator/spec/sampling.py), never of a greedy key.
    assert set(point.columns()) == {
        "mode",
        "rtt_ms",
        "gamma",
        "clients",
        "repeat",
        "temperature",
        "top_k",
        "top_p",
        "sampling_seed",
    }
    assert link_keys.point_spec(point) == LinkSpec(rtt_ms=20)


def test_asymmetric_delays_give_the_rtt_and_each_direction():
    experiment = experiment_from_dict(
        {**{k: v for k, v in BASE.items() if k != "rtt_ms"}, "delay_up_ms": [5], "delay_down_ms": [45, 95]}
    )
    points = plan_points(experiment)
    assert [(p.rtt_ms, p.delay_up_ms) for p in points] == [(50, 5), (100, 5)]
    spec = link_keys.point_spec(points[1])
    assert (spec.up.delay_ms, spec.down.delay_ms) == (5, 95)


@pytest.mark.parametrize("launcher", ["sim", "loopback"])
def test_launchers_without_shaping_refuse_link_keys_naming_them(launcher):
    experiment = experiment_from_dict({**BASE, "loss_pct": [1]})
    with pytest.raises(ValueError, match=f"'loss_pct'.*{launcher} launcher"):
        link_keys.check_launcher(experiment, launcher)
    link_keys.check_launcher(experiment, "netns")
    link_keys.check_launcher(experiment_from_dict(BASE), launcher)


def test_points_table_gets_each_points_link_configured_and_measured():
    points = pd.DataFrame({"mode": ["sync", "sync"], "rtt_ms": [20.0, 20.0], "loss_pct": [0.0, 5.0]})
    rows = pd.DataFrame(
        {
            "mode": ["sync"] * 4,
            "rtt_ms": [20.0] * 4,
            "loss_pct": [0.0, 0.0, 5.0, 5.0],
            "edge": ["e0", "e1", "e0", "e1"],
            "loss_measured_pct": [0.0, 1.0, 9.0, 11.0],
            "loss_expected_pct": [0.0, 0.0, 9.75, 9.75],
            "rtt_measured_stdev_ms": [0.1, 0.3, 0.2, 0.2],
            "rtt_expected_p50_ms": [20.0] * 4,
            "rtt_expected_stdev_ms": [0.0] * 4,
        }
    )
    table = link_rows.add_link_columns(points, rows, ["mode", "rtt_ms", "loss_pct"])
    assert table["loss_link_pct"].tolist() == [0.5, 10.0]
    assert table["loss_link_expected_pct"].tolist() == [0.0, 9.75]
    assert table["rtt_link_stdev_ms"].tolist() == [0.2, 0.2]
    assert len(table) == 2


def test_point_of_old_positional_form_still_builds():
    assert Point("ar", 10.0, 4, 1, 0).key == "ar_rtt10ms_g4_c1_r0"


def test_per_edge_links_mix_near_and_far_clients_over_the_points_link():
    experiment = experiment_from_dict(
        {**BASE, "edges": 3, "jitter_ms": [0, 2], "link": {"edges": [{"rtt_ms": 10}, {"rtt_ms": 150, "loss_pct": 1}]}}
    )
    point = plan_points(experiment)[-1]  # rtt 40, jitter 2
    specs = link_keys.edge_specs(experiment.link, point, 3)
    assert specs == [
        LinkSpec(rtt_ms=10, jitter_ms=2),
        LinkSpec(rtt_ms=150, jitter_ms=2, loss_pct=1),
        LinkSpec(rtt_ms=10, jitter_ms=2),
    ]  # edge 2 takes entry 2 mod 2
    assert link_keys.edge_specs(None, point, 2) == [LinkSpec(rtt_ms=40, jitter_ms=2)] * 2


def test_drawn_edge_rtts_are_seeded_in_range_and_the_same_at_every_point():
    experiment = experiment_from_dict({**BASE, "edges": 8, "link": {"draw_rtt_ms": [10, 200], "seed": 3}})
    first, last = plan_points(experiment)[0], plan_points(experiment)[-1]
    rtts = [s.rtt_ms for s in link_keys.edge_specs(experiment.link, first, 8)]
    assert every(10 <= r <= 200 for r in rtts) and len(set(rtts)) == 8
    assert rtts == [s.rtt_ms for s in link_keys.edge_specs(experiment.link, last, 8)]
    other = experiment_from_dict({**BASE, "edges": 8, "link": {"draw_rtt_ms": [10, 200], "seed": 4}})
    assert rtts != [s.rtt_ms for s in link_keys.edge_specs(other.link, first, 8)]


@pytest.mark.parametrize(
    "link,message",
    [
        ({"edges": [{"rtt_ms": -1}]}, r"'link.edges\[0\]'.*rtt_ms"),
        ({"edges": [{"rtt_ms": 10}, {"latency": 3}]}, r"'link.edges\[1\]'.*latency"),
        ({"edges": [{"rtt_ms": 4, "jitter_ms": 3}]}, r"'link.edges\[0\]'.*jitter_ms"),
        ({"edges": [{"jitter_ms": 15}]}, r"'link.edges\[0\]'.*jitter_ms.*one-way"),  # on the point's rtt 20
        ({"draw_rtt_ms": [200, 10]}, r"'link.draw_rtt_ms'"),
        ({"draw_rtt_ms": [10, 20], "edges": [{"rtt_ms": 1}]}, r"'link.draw_rtt_ms'.*choose one"),
        ({"seed": -1}, r"'link.seed'"),
        ({"edge": []}, r"unknown key.*\[link\].*edge"),
        ({"schedule": [{"at_s": 1, "rtt_ms": 5}], "schedule_order": "fifo"}, r"'link.schedule_order'.*path"),
        ({"schedule_order": "queue"}, r"'link.schedule_order'.*only with a link schedule"),
    ],
)
def test_bad_per_edge_links_fail_in_one_line_naming_the_key(link, message):
    with pytest.raises(ValueError, match=message) as info:
        experiment_from_dict({**BASE, "link": link})
    assert "\n" not in str(info.value)


def test_loopback_takes_per_edge_rtts_only_and_sim_none():
    experiment = experiment_from_dict({**BASE, "link": {"edges": [{"rtt_ms": 10}, {"rtt_ms": 90}]}})
    link_keys.check_launcher(experiment, "loopback")
    with pytest.raises(ValueError, match="'link'.*sim"):
        link_keys.check_launcher(experiment, "sim")
    lossy = experiment_from_dict({**BASE, "link": {"edges": [{"rtt_ms": 10, "loss_pct": 1}]}})
    with pytest.raises(ValueError, match=r"'link.edges\[0\]'.*loopback"):
        link_keys.check_launcher(lossy, "loopback")


def test_link_schedule_steps_and_trace_are_read_and_checked_against_every_link(tmp_path):
    experiment = experiment_from_dict(
        {**BASE, "link": {"schedule": [{"at_s": 0.5, "rtt_ms": 150}, {"at_s": 1, "loss_pct": 2}]}}
    )
    schedule = experiment.link.schedule
    assert schedule.state_at(LinkSpec(rtt_ms=20), 1.5) == LinkSpec(rtt_ms=150, loss_pct=2)
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,rtt_ms,jitter_ms\n0,30,1\n0.2,50,2\n")
    traced = experiment_from_dict({**BASE, "link": {"trace_csv": str(trace)}})
    assert traced.link.schedule.source == "t.csv" and len(traced.link.schedule.steps) == 2
    with pytest.raises(ValueError, match=r"'link.schedule'.*jitter_ms") as info:  # 12 ms > half of rtt 20
        experiment_from_dict({**BASE, "link": {"schedule": [{"at_s": 1, "jitter_ms": 12}]}})
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"'link.trace_csv'.*No such file"):
        experiment_from_dict({**BASE, "link": {"trace_csv": str(tmp_path / "missing.csv")}})
    with pytest.raises(ValueError, match=r"'link.schedule'.*loopback"):
        link_keys.check_launcher(experiment, "loopback")


def test_rounds_are_joined_to_the_link_change_in_force_when_sent():
    schedule = experiment_from_dict({**BASE, "link": {"schedule": [{"at_s": 1, "rtt_ms": 100}]}}).link.schedule
    scheduled = ScheduledPoint(None, [LinkSpec(rtt_ms=20), LinkSpec(rtt_ms=50)], schedule)
    scheduled.t0_s, scheduled.unix_minus_mono_s = 900.0, 100.0
    rounds = pd.DataFrame({"client_id": ["0", "1", "0", "1"], "t_send_s": [1000.5, 1000.5, 1001.2, float("nan")]})
    out = scheduled.annotate_rounds(rounds, 2)
    assert out["link_change_index"].tolist() == [0, 0, 1, -1]
    assert out["link_rtt_configured_ms"].tolist()[:3] == [20, 50, 100]


def test_a_change_seen_by_its_first_probe_settles_in_exactly_zero_ms_at_any_clock():
    """CI's monotonic clock (~1.8e6 s) once made a bracket that starts at the change read -7e-10 ms:
    t0 + at - t0 - at is not 0 in floats. The settle times come from the change's own float."""
    from types import SimpleNamespace

    schedule = experiment_from_dict(
        {**BASE, "link": {"schedule": [{"at_s": 0.3, "rtt_ms": 80}, {"at_s": 0.8, "rtt_ms": 5}]}}
    ).link.schedule
    for t0_s in (1796212.041, 900.0, 12345678.9):
        scheduled = ScheduledPoint(None, [LinkSpec(rtt_ms=10)], schedule)
        scheduled.t0_s, scheduled.t_end_s = t0_s, t0_s + 1.0
        # Each change's first probe already sees the new link; the one before it saw the old one.
        scheduled._timeline = [
            [(t0_s + 0.29, 10.0), (t0_s + 0.3 + 0.002, 80.1), (t0_s + 0.79, 80.0), (t0_s + 0.8 + 0.002, 5.1)]
        ]
        rows = scheduled.rows([SimpleNamespace(edge="edge0", shaper="nfqueue")])
        assert [r["change_settle_min_ms"] for r in rows] == [0.0, 0.0], t0_s
        assert [round(r["change_settle_ms"], 6) for r in rows] == [2.0, 2.0]


def test_country_pair_links_draw_rtts_whose_mean_matches_the_data():
    from orchestrator.links import geography

    for edge, cloud in (("IN", "US"), ("DE", "US"), ("JP", "US"), ("BR", "US"), ("DE", "DE")):
        stats = geography.pair_stats(edge, cloud)
        rng = __import__("random").Random(7)
        draws = [stats.draw_rtt_ms(rng) for _ in range(20_000)]
        assert sum(draws) / len(draws) == pytest.approx(stats.mean_ms, rel=0.05), (edge, cloud)
        lo, hi = stats.bounds_ms
        assert lo <= min(draws) and max(draws) <= hi <= 4 * stats.mean_ms
    assert geography.pair_stats("IN", "US").mean_ms == pytest.approx(
        212.13, abs=0.01
    )  # the IN-US pair's mean in data/country_rtt_stat.csv.gz
    assert geography.pair_stats("us", "in").mean_ms == geography.pair_stats("IN", "US").mean_ms


def test_every_pair_in_the_data_keeps_its_mean_through_the_truncation():
    from orchestrator.links import geography

    pairs = list(geography.load_pairs())
    assert len(pairs) > 6000
    stats = [geography.pair_stats(*p) for p in pairs]
    assert [s for s in stats if abs(s.mean_of_draws_ms() / s.mean_ms - 1) > 0.01] == []


def test_edges_given_as_country_pairs_get_seeded_drawn_rtts():
    experiment = experiment_from_dict(
        {
            **BASE,
            "edges": 4,
            "link": {
                "seed": 2,
                "edges": [
                    {"edge_country": "IN", "cloud_country": "US"},
                    {"edge_country": "DE", "cloud_country": "DE", "jitter_ms": 1},
                ],
            },
        }
    )
    point = plan_points(experiment)[0]
    specs = link_keys.edge_specs(experiment.link, point, 4)
    assert specs == link_keys.edge_specs(experiment.link, point, 4)
    assert 53 < specs[0].rtt_ms < 849 and specs[1].jitter_ms == 1 and specs[0].rtt_ms != specs[2].rtt_ms


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"edge_country": "XX", "cloud_country": "US"}, r"'link.edges\[0\]'.*edge_country.*'XX'"),
        ({"edge_country": "IN", "cloud_country": "Mars"}, r"'link.edges\[0\]'.*cloud_country.*'Mars'"),
        ({"edge_country": "IN"}, r"'link.edges\[0\]'.*together"),
        ({"edge_country": "IN", "cloud_country": "US", "rtt_ms": 5}, r"'link.edges\[0\]'.*not both"),
    ],
)
def test_unknown_countries_fail_in_one_line_naming_the_key(entry, message):
    with pytest.raises(ValueError, match=message) as info:
        experiment_from_dict({**BASE, "link": {"edges": [entry]}})
    assert "\n" not in str(info.value)


def test_serialisation_term_adds_the_wire_time_of_a_rounds_bytes_per_token():
    points = pd.DataFrame(
        {
            "mode": ["sync", "sync"],
            "rate_mbit": [0.0, 1.0],
            "per_token_ms_predicted": [10.0, 10.0],
            "tokens_per_round": [3.0, 3.0],
            "wire_bytes_per_round_up": [600.0, 600.0],
            "wire_bytes_per_round_down": [150.0, 150.0],
        }
    )
    out = wire_prediction.add_wire_prediction(points)
    # 750 bytes at 1 Mbit/s = 6 ms a round, over 3 tokens.
    assert out["serialisation_ms_per_token"].tolist() == [0.0, pytest.approx(2.0)]
    assert out["per_token_ms_predicted_wire"].tolist() == [10.0, pytest.approx(12.0)]


def test_serialisation_term_charges_what_a_round_carries_greedy_sparse_or_dense():
    """Predicted bytes by (gamma, vocab, sampling) replace the measured ones; under top-p alone (its
    kept ids unknown) the Verify falls back to them and the verdict is still predicted."""
    from services import wire_size

    sampling = [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 20, 1.0), (0.8, 0, 0.9)]
    points = pd.DataFrame(
        {
            "mode": "sync",
            "gamma": 4,
            "rate_mbit": 10.0,
            "per_token_ms_predicted": 10.0,
            "tokens_per_round": 2.0,
            "wire_bytes_per_round_up": 1000.0,
            "wire_bytes_per_round_down": 250.0,
            "temperature": [t for t, _, _ in sampling],
            "top_k": [k for _, k, _ in sampling],
            "top_p": [p for _, _, p in sampling],
        }
    )
    out = wire_prediction.add_wire_prediction(points, vocab=1000)
    for row, (t, k, p) in zip(out.itertuples(), sampling[:3]):
        up, down = wire_size.round_wire_bytes(4, 1000, t, k or None, p)
        assert (row.wire_bytes_per_round_up_predicted, row.wire_bytes_per_round_down_predicted) == (up, down)
        data_up, data_down = wire_size.round_wire_bytes(4, 1000, t, k or None, p, acks=False)
        assert up - data_up == 52 and (down - data_down) % 52 == 0 < down - data_down  # the pure ACKs
        assert row.serialisation_ms_per_token == pytest.approx(8 * (data_up + data_down) / 10e3 / 2)
    greedy, dense, sparse, nucleus = out["serialisation_ms_per_token"]
    assert greedy < sparse < dense and dense > 16 * 1000 * 8 / 10e3 / 2  # 16 kB of q a round
    assert math.isnan(out["wire_bytes_per_round_up_predicted"][3])  # the nucleus: the measured Verify,
    _, verdict = wire_size.round_wire_bytes(
        4, 1000, 0.8, None, 0.9, kept_per_row=1.0, acks=False
    )  # the verdict's bytes
    assert out["wire_bytes_per_round_down_predicted"][3] == wire_size.round_wire_bytes(4, 1000, 0.8, 20, 1.0)[1]
    assert nucleus == pytest.approx(8 * (1000 + verdict) / 10e3 / 2)
    measured = 8 * 1250 / 10e3 / 2
    assert (
        wire_prediction.add_wire_prediction(points)["serialisation_ms_per_token"].tolist() == [measured] * 4
    )  # no vocab


def test_a_verifier_run_mode_charges_its_tokens_message_down_and_acks_up():
    from services import wire_size

    point = {"mode": "ar", "gamma": 4, "tokens_per_round": 1.0, "temperature": 0.8, "top_k": 0, "top_p": 1.0}
    assert wire_prediction.predicted_round_bytes(point, 1000) == wire_size.stream_round_wire_bytes(1, 1000, 4)
    up, down = wire_prediction.predicted_round_bytes(point, 1000)
    assert up == 52 and 52 + wire_size.tokens_bytes(1, 1000, 4) < down < 250  # no q travels
    assert math.isnan(wire_prediction.predicted_round_bytes({**point, "mode": "warp"}, 1000)[0])


def test_the_vocabulary_comes_from_the_synthetic_backend_or_the_target_models_config(tmp_path):
    assert wire_prediction.experiment_vocab({"backend": {"kind": "synthetic", "vocab_size": 300}}) == 300
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text('{"vocab_size": 49152}')
    assert wire_prediction.experiment_vocab({"backend": {"kind": "hf", "pair_path": str(tmp_path)}}) == 49152
    assert wire_prediction.experiment_vocab({"backend": {"kind": "hf", "pair_path": str(tmp_path / "none")}}) is None


def test_rule_counters_are_read_per_queue():
    from netem.rules import parse_counters

    text = (
        "-N DSDBED-ab12\n"
        "-A DSDBED-ab12 -m physdev --physdev-in e0 --physdev-out v -c 11 924 -j NFQUEUE --queue-num 1000\n"
        "-A DSDBED-ab12 -m physdev --physdev-in v --physdev-out e0 -c 9 756 -j NFQUEUE --queue-num 1001\n"
    )
    assert parse_counters(text) == {1000: (11, 924), 1001: (9, 756)}
