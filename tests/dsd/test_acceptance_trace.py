"""Acceptance traces: the synthetic draft replays a real pair's per-round accepted counts."""

import random

import pytest

from dsd.backends.acceptance_trace import ACCEPT, REJECT, UNTESTED, AcceptanceTrace, read_rounds_csv
from dsd.backends.factory import SyntheticBackendConfig, backend_from_dict, load_pair
from dsd.backends.synthetic import SyntheticConfig, SyntheticLM
from dsd.drive.generation import generate_ar, generate_colocated
from dsd.simulation.one_client import LinkCosts, simulate_dsd
from dsd.speculation.stopping import StopRule
from tests.acceptance_traces import bimodal_trace, histogram, total_variation, write_rounds
from dsd.drive.driver import DriverConfig


def pair(trace, seed=0):
    config = SyntheticConfig(vocab_size=512, seed=seed, acceptance_trace=trace)
    return SyntheticLM(config, "draft"), SyntheticLM(config, "target")


def prompts(n, length=8, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, 512) for _ in range(length)] for _ in range(n)]


def test_rounds_become_positions_with_the_bonus_position_untested():
    trace = AcceptanceTrace(((4, 2), (4, 4), (4, 0)))
    assert list(trace.outcomes) == [ACCEPT, ACCEPT, REJECT, *[ACCEPT] * 4, UNTESTED, REJECT]
    assert trace.round_starts == (0, 3, 8)
    assert trace.alpha_measured == pytest.approx(6 / 8)
    assert trace.outcome(9) == ACCEPT  # wraps around
    assert AcceptanceTrace.from_text(trace.to_text()).rounds == trace.rounds


@pytest.mark.parametrize("text", ["4:5", "4-2", "0:0", "4:2,", ""])
def test_bad_inline_rounds_are_refused(text):
    with pytest.raises(ValueError, match="acceptance"):
        AcceptanceTrace.from_text(text)


def test_a_rounds_csv_gives_its_live_rounds_request_by_request(tmp_path):
    path = write_rounds(
        tmp_path / "rounds.csv",
        [
            ("p", 0, 1, 0, 4, 3, False, ""),
            ("p", 0, 0, 1, 4, 1, False, ""),  # written out of order: a concurrent client's
            ("p", 0, 0, 0, 4, 4, False, ""),
            ("p", 0, 0, 2, 4, 0, True, ""),  # stale: no verdict of the target
            ("p", 0, 0, 3, 0, 0, False, ""),  # an AR row
            ("p", 0, 0, 4, 4, 2, False, "boom"),  # an error row
        ],
    )
    assert read_rounds_csv(path).rounds == ((4, 4), (4, 1), (4, 3))
    with pytest.raises(ValueError, match="acceptance_trace.*no column"):
        read_rounds_csv(write_rounds(tmp_path / "x.csv", [(1, 2)], columns=("a", "b")))
    with pytest.raises(ValueError, match="acceptance_trace.*does not exist"):
        read_rounds_csv(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="no live rounds"):
        read_rounds_csv(write_rounds(tmp_path / "ar.csv", [("p", 0, 0, 0, 0, 0, False, "")]))


def test_at_the_traces_gamma_a_request_replays_consecutive_trace_rounds_exactly():
    trace = bimodal_trace()
    draft, target = pair(trace, seed=3)
    for index, prompt in enumerate(prompts(5)):
        generation = generate_colocated(draft, target, prompt, 4, StopRule(60, None), seq_id=f"r{index}")
        first = trace.round_starts.index(trace.start_index(3, prompt))
        expected = [trace.rounds[(first + i) % len(trace.rounds)][1] for i in range(len(generation.rounds))]
        assert [r.accepted for r in generation.rounds] == expected


def test_a_smaller_gamma_truncates_and_goes_on_where_the_round_stopped():
    trace = AcceptanceTrace(((4, 3),) * 10)  # A A A R, A A A R, ...
    draft, target = pair(trace)
    generation = generate_colocated(draft, target, prompts(1)[0], 2, StopRule(30, None))
    # gamma 2: accept A A (the bonus takes the third A), then the R alone, and again
    assert [r.accepted for r in generation.rounds][:6] == [2, 0, 2, 0, 2, 0]


def test_a_trace_driven_run_reproduces_the_traces_accepted_count_histogram():
    """Sync DSD over many requests: the run's histogram is the trace's, and far from the
    geometric one that i.i.d. acceptance at the same fitted alpha gives."""
    trace = bimodal_trace(n_rounds=300)
    draft, target = pair(trace, seed=7)
    iid_draft, iid_target = load_pair(SyntheticBackendConfig(alpha=trace.alpha_measured, seed=7))
    link = LinkCosts(0.004, 0.010, 0.020)
    traced, iid = [], []
    for index, prompt in enumerate(prompts(150, seed=2)):
        for name, model, out in (("t", draft, traced), ("i", iid_draft, iid)):
            run = simulate_dsd(
                model, target, prompt, StopRule(48, None), link, DriverConfig(4, "sync"), seq_id=f"{name}{index}"
            )
            out += [r.accepted for r in run.generation.rounds if not r.stale]
    want = {a: c / len(trace.rounds) for a, c in trace.histogram().items()}
    assert len(traced) > 2000
    assert total_variation(histogram(traced), want) < 0.05, (histogram(traced), want)
    assert total_variation(histogram(iid), want) > 0.2, (histogram(iid), want)


def test_greedy_output_stays_the_targets_in_every_mode_with_a_trace():
    trace = bimodal_trace()
    draft, target = pair(trace)
    link = LinkCosts(0.004, 0.010, 0.030)
    for index, prompt in enumerate(prompts(3)):
        want = generate_ar(target, prompt, StopRule(40, None), seq_id=f"ar{index}").tokens
        assert generate_colocated(draft, target, prompt, 4, StopRule(40, None), seq_id=f"co{index}").tokens == want
        for pipelined in (False, True):
            run = simulate_dsd(
                draft,
                target,
                prompt,
                StopRule(40, None),
                link,
                DriverConfig(4, "pipelined" if pipelined else "sync", max_in_flight=2),
                seq_id=f"d{index}{pipelined}",
            )
            assert run.generation.tokens == want


def test_seeds_choose_other_stretches_of_the_trace():
    trace = bimodal_trace()
    prompt = prompts(1)[0]
    starts = {trace.start_index(seed, prompt) for seed in range(20)}
    assert len(starts) > 10 and starts <= set(trace.round_starts)


def test_the_backend_config_takes_a_path_or_inline_rounds_not_both(tmp_path):
    path = write_rounds(tmp_path / "rounds.csv", [("p", 0, 0, 0, 4, 2, False, "")])
    assert SyntheticBackendConfig(acceptance_trace=str(path)).trace().rounds == ((4, 2),)
    assert SyntheticBackendConfig(acceptance_rounds="4:2,4:4").trace().rounds == ((4, 2), (4, 4))
    with pytest.raises(ValueError, match="give one"):
        SyntheticBackendConfig(acceptance_trace=str(path), acceptance_rounds="4:2")
    with pytest.raises(ValueError, match=r"unknown key.*acceptance_rounds.*'hf'"):  # a real pair has its own
        backend_from_dict({"kind": "hf", "acceptance_rounds": "4:2"})
    with pytest.raises(ValueError, match="acceptance_trace"):
        SyntheticBackendConfig(acceptance_trace=str(tmp_path / "nope.csv"))
