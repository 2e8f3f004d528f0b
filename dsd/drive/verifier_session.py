"""The target's side of one request: committed tokens, prefill, AR steps and block verification.

KV invariant: after every operation the target's cache holds exactly ``committed[:-1]``; the
last committed token is fed as the first position of the next pass (the gpt-fast layout), so a
verification is one pass over gamma+1 positions and nothing committed is computed twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsd.backends.protocol import ForwardJob, LanguageModel, LogitsRequest, Proposal, SamplingParams, Verdict
from dsd.speculation.draws import TARGET, VERIFY, Draws
from dsd.features import FeatureBlock, ProvidesFeatures
from dsd.sequence import TokenSequence
from dsd.speculation.stopping import StopRule, round_tokens
from dsd.speculation.verification import greedy_verify, sample_index, sampling_probs, speculative_sample


class VerifierSession:
    def __init__(
        self, target: LanguageModel, seq_id: str, prompt: Sequence[int], sampling: SamplingParams, stop: StopRule
    ) -> None:
        if len(prompt) < 1:
            raise ValueError("prompt must hold at least one token")
        self.target = target
        self.seq_id = seq_id
        self.sampling = sampling
        self.stop = stop
        self.committed = TokenSequence(prompt)
        self.prompt_length = len(prompt)
        self.draws = Draws(sampling.seed)
        self.prefilled = False

    @property
    def generated(self) -> list[int]:
        return self.committed.tokens[self.prompt_length :]

    @property
    def finished(self) -> bool:
        return self.stop.finished_in(self.committed.tokens, self.prompt_length)

    def prefill(self) -> int:
        """Feed prompt[:-1]; returns the number of positions computed."""
        n_positions = self.prompt_length - 1
        if n_positions > 0:
            self.target.logits(self.seq_id, self.committed.tokens[:-1], 1)
        self.prefilled = True
        return n_positions

    def ar_step(self) -> list[int]:
        """One autoregressive target step; returns the emitted token (empty once finished)."""
        return [] if self.finished else self.ar_job().run()

    def ar_job(self) -> ForwardJob[list[int]]:
        """An AR step as a job the scheduler may batch with other sessions' (not once finished)."""

        def finish(logits: torch.Tensor) -> list[int]:  # [1, vocab]
            return self._commit(round_tokens((), 0, self._pick(logits)[0]))

        return ForwardJob(self.target, LogitsRequest(self.seq_id, self.committed.tokens, 1), finish)

    def verify(self, proposal: Proposal) -> Verdict:
        """One target pass over [last committed token] + the block; stale blocks cost nothing."""
        job = self.verify_job(proposal)
        return Verdict(proposal.start_pos, proposal.gamma, 0, -1, stale=True) if job is None else job.run()

    def verify_job(self, proposal: Proposal) -> ForwardJob[Verdict] | None:
        """A verification as a job the scheduler may batch with other sessions' (one pass over
        gamma+1 positions); None if the block is stale (nothing to compute)."""
        gamma = proposal.gamma
        if self.finished or not self._proposal_matches(proposal):
            return None
        block = list(proposal.draft_tokens)
        draft_probs = proposal.draft_probs
        if not self.sampling.greedy and draft_probs is None:
            raise ValueError("sampling verification needs the draft's probabilities q")

        def finish(logits: torch.Tensor) -> Verdict:  # [gamma+1, vocab]
            draft = torch.tensor(block, dtype=torch.long)  # [gamma]
            if self.sampling.greedy:
                outcome = greedy_verify(logits, draft)
            else:
                assert draft_probs is not None  # checked above: a sampling verification has q
                p = sampling_probs(logits, self.sampling)
                outcome = speculative_sample(p, draft_probs.float(), draft, self.draws.at(proposal.start_pos, VERIFY))
            self._commit(round_tokens(block, outcome.accepted, outcome.next_token))
            return Verdict(
                proposal.start_pos,
                gamma,
                outcome.accepted,
                outcome.next_token,
                features=self.decided_features(proposal.start_pos),
            )

        return ForwardJob(self.target, LogitsRequest(self.seq_id, self.committed.tokens + block, gamma + 1), finish)

    def decided_features(self, before: int) -> FeatureBlock | None:
        """The target's features at the positions whose next token was decided since the committed
        prefix was ``before`` tokens long (rows before - 1 .. len(committed) - 2; after the
        prefill, ``decided_features(1)`` is the prompt's); None if the target keeps none."""
        if not isinstance(self.target, ProvidesFeatures):
            return None
        start = max(before - 1, 0)
        end = min(len(self.committed) - 1, self.target.cached_length(self.seq_id))
        return self.target.features(self.seq_id, start, max(start, end))

    def proposal_for(self, draft_tokens: Sequence[int], draft_probs: torch.Tensor | None) -> Proposal:
        """A block drafted on the committed prefix (co-located SD, synchronous rounds)."""
        n = len(self.committed)
        return Proposal(n, self.committed.digest_at(n), tuple(draft_tokens), draft_probs)

    def _proposal_matches(self, proposal: Proposal) -> bool:
        return proposal.start_pos == len(self.committed) and self.committed.matches(
            proposal.start_pos, proposal.base_digest
        )

    def _pick(self, logits: torch.Tensor) -> list[int]:
        if self.sampling.greedy:
            return logits.argmax(dim=-1).tolist()
        p = sampling_probs(logits, self.sampling)
        start = len(self.committed)
        return [sample_index(row, self.draws.at(start + i, TARGET)) for i, row in enumerate(p)]

    def _commit(self, new_tokens: list[int]) -> list[int]:
        emitted = self.stop.clip(new_tokens, len(self.generated))
        self.committed.extend(emitted)
        # Rejected drafts (and anything past the stop) leave the cache now, not at the next pass.
        self.target.crop(self.seq_id, len(self.committed) - 1)
        return emitted

    def close(self) -> None:
        self.target.release(self.seq_id)
