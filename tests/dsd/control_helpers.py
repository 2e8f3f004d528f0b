"""What the controller tests share (tests/dsd/test_control_*.py): a scripted controller, the
synthetic pair they run, and the exact distribution sampled runs are checked against."""

import itertools

from dsd.backends.synthetic import SyntheticConfig, SyntheticLM


class Scripted:
    """A controller that plays a fixed list of plans, one per decision, then repeats the last."""

    def __init__(self, plans):
        self.plans, self.calls, self.seen = list(plans), 0, []

    def observe(self, observation):
        self.seen.append(observation)

    def decide(self):
        plan = self.plans[min(self.calls, len(self.plans) - 1)]
        self.calls += 1
        return plan


def synthetic_pair(alpha=0.7, seed=5):
    config = SyntheticConfig(alpha=alpha, seed=seed)
    return SyntheticLM(config, "draft"), SyntheticLM(config, "target")


def bigram_sequence_probs(target_table, vocab: int, length: int) -> dict:
    """Every token sequence of the given length and its probability under the bigram target
    (starting after token 0): the distribution exact sampling must reproduce."""
    exact = {}
    for seq in itertools.product(range(vocab), repeat=length):
        prob, previous = 1.0, 0
        for token in seq:
            prob *= float(target_table[previous, token])
            previous = token
        exact[seq] = prob
    return exact
