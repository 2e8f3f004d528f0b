"""In-process decoding loops: cloud AR and co-located SD (both run on the server).

The edge side of DSD is ``dsd.drive.edge_decoder.EdgeDecoder``; ``dsd.simulation.one_client`` drives it in process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dsd.backends.protocol import LanguageModel, SamplingParams, Verdict
from dsd.speculation.draws import Draws
from dsd.speculation.drafting import begin_request, draft_block
from dsd.features import hand_features
from dsd.speculation.stopping import StopRule
from dsd.drive.verifier_session import VerifierSession


@dataclass(frozen=True)
class RoundRecord:
    round_index: int
    proposed: int
    accepted: int
    emitted: int
    stale: bool = False
    gamma: int = 0  # the block's planned gamma and mode (dsd.controller.interface); 0/"" where unplanned
    mode: str = ""
    cache: object = None  # the cached mode: what the verdict met (dsd.cache.filler.CacheRecord)

    @classmethod
    def from_verdict(
        cls, round_index: int, verdict: Verdict, emitted: int, gamma: int = 0, mode: str = "", cache: object = None
    ) -> RoundRecord:
        return cls(round_index, verdict.proposed, verdict.accepted, emitted, verdict.stale, gamma, mode, cache)


def first_emission(rounds: Sequence[RoundRecord]) -> int:
    """Tokens the first emitting round carried (1 where no round emitted): the tokens that a
    request's steady-state rate (dsd.costs.compute_times.steady_per_token_s) leaves out with its start."""
    return next((r.emitted for r in rounds if r.emitted), 1)


@dataclass
class Generation:
    tokens: list[int]  # generated tokens, prompt excluded
    rounds: list[RoundRecord] = field(default_factory=list)

    @property
    def alpha_measured(self) -> float:
        """Maximum-likelihood alpha under i.i.d. acceptance: each round shows accepted successes
        and, unless all were accepted, one failure."""
        live = [r for r in self.rounds if not r.stale]
        accepted = sum(r.accepted for r in live)
        rejections = sum(r.accepted < r.proposed for r in live)
        return accepted / (accepted + rejections) if accepted + rejections else float("nan")

    @property
    def tokens_per_round(self) -> float:
        live = [r for r in self.rounds if not r.stale]
        return sum(r.emitted for r in live) / len(live) if live else float("nan")


def generate_ar(
    target: LanguageModel,
    prompt: Sequence[int],
    stop: StopRule,
    sampling: SamplingParams = SamplingParams(),
    seq_id: str = "autoregressive",
) -> Generation:
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    session.prefill()
    while not session.finished:
        session.ar_step()
    tokens = session.generated
    session.close()
    return Generation(tokens)


def generate_colocated(
    draft: LanguageModel,
    target: LanguageModel,
    prompt: Sequence[int],
    gamma: int,
    stop: StopRule,
    sampling: SamplingParams = SamplingParams(),
    seq_id: str = "co",
    draws: Draws | None = None,
) -> Generation:
    """Co-located SD: each round drafts gamma tokens and verifies them in one target pass.
    ``draws``: the request's random draws (default: dsd.speculation.draws keyed by the sampling seed)."""
    session = VerifierSession(target, seq_id, prompt, sampling, stop)
    session.draws = draws or session.draws
    session.prefill()
    begin_request(draft, seq_id, prompt, gamma)
    hand_features(draft, seq_id, session.decided_features(1))
    generation = Generation([])
    while not session.finished:
        drafted, q = draft_block(draft, seq_id, session.committed.tokens, gamma, sampling, session.draws)
        before = len(session.committed)
        verdict = session.verify(session.proposal_for(drafted, q))
        hand_features(draft, seq_id, verdict.features)
        generation.rounds.append(
            RoundRecord.from_verdict(len(generation.rounds), verdict, len(session.committed) - before)
        )
    generation.tokens = session.generated
    session.close()
    draft.release(seq_id)
    return generation
