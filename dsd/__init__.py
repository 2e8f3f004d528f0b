"""dsd: the decoding core shared by the verifier and edge services.

Glossary (the words used in code, CSV columns and plots; notation of docs/concepts.md):

round            the drafter proposes ``gamma`` tokens, the target verifies them in one forward
                 pass over gamma+1 positions and returns a verdict.
proposed         the number of draft tokens sent in a round (``gamma``).
accepted         how many of them the target accepted, a prefix of the block (0..gamma).
corrected token  the target's own token at the first rejected position (accepted < gamma).
bonus token      the target's extra token after a fully accepted block (accepted == gamma).
next token       the corrected or the bonus token: every round emits exactly one.
emitted          tokens per round = accepted + 1.
stale            pipelined DSD only: a block drafted on a speculative prefix that the target's
                 verdicts have since contradicted; it costs no target compute and emits nothing.
committed        the tokens the target has confirmed so far (prompt + emitted).
alpha            probability that one draft token is accepted.
t_draft_s        one draft-model step; t_verify_s one target pass over gamma+1 positions;
                 t_ar_s one autoregressive target step; rtt_s the edge-verifier round trip.
"""
