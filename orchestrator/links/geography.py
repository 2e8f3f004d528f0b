"""Real geography: a link's RTT drawn from measured country-to-country statistics (pure).

`data/country_rtt_stat.csv.gz` (RIPE Atlas, 2025; provenance in data/README.md) gives, per
unordered country pair, the mean, standard deviation, min and max RTT over many address pairs.
A link given as ``{edge_country = "IN", cloud_country = "US"}`` draws ONE RTT for its edge (a
client in India sits on one path to the cloud; the spread in the data is over paths, not over the
packets of one path; give jitter_ms for that), seeded, so a sweep is reproducible.

The sampler, `PairStats.draw_rtt_ms`: a truncated lognormal.
- shape: sigma = sqrt(ln(1 + cv^2)) with cv = std/mean capped at 1 (the data's stdevs are
  inflated by timeouts of minutes; a capped cv keeps a realistic right skew);
- truncation: to [lo, hi] with lo = max(rtt_min, mean/4) (the min is often a mislocated address
  at ~0 ms) and hi = min(rtt_max, 4 x mean) (the max is a timeout, not a path);
- location: mu chosen so that the TRUNCATED distribution's mean is the data's mean (bisection on
  the closed form of a truncated lognormal's mean), so draws keep the measured mean however the
  tails are cut; drawn by inverse CDF between the truncation points.
A pair measured with no spread (std 0, or a single ping) gives its mean.
"""

from __future__ import annotations

import csv
import functools
import gzip
import math
import random
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

DATA_PATH = Path(__file__).resolve().parents[2] / "data" / "country_rtt_stat.csv.gz"
CV_CAP = 1.0
LO_FRACTION, HI_FACTOR = 0.25, 4.0
_N = NormalDist()


@dataclass(frozen=True)
class PairStats:
    edge_country: str
    cloud_country: str
    n_pings: int
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float

    @property
    def bounds_ms(self) -> tuple[float, float]:
        return max(self.min_ms, LO_FRACTION * self.mean_ms), min(self.max_ms, HI_FACTOR * self.mean_ms)

    @functools.cached_property
    def _fit(self) -> tuple[float, float] | None:
        """(mu, sigma) of the truncated lognormal; None for a pair without spread."""
        lo, hi = self.bounds_ms
        if self.std_ms <= 0 or not lo < self.mean_ms < hi:
            return None
        sigma = math.sqrt(math.log(1.0 + min(self.std_ms / self.mean_ms, CV_CAP) ** 2))
        a, b = math.log(lo), math.log(hi)
        lo_mu, hi_mu = a - 40 * sigma - 5, b + 40 * sigma + 5  # the truncated mean rises with mu
        for _ in range(100):
            mu = (lo_mu + hi_mu) / 2
            if truncated_lognormal_mean(mu, sigma, lo, hi) < self.mean_ms:
                lo_mu = mu
            else:
                hi_mu = mu
        return (lo_mu + hi_mu) / 2, sigma

    def mean_of_draws_ms(self) -> float:
        fit = self._fit
        return self.mean_ms if fit is None else truncated_lognormal_mean(*fit, *self.bounds_ms)

    def draw_rtt_ms(self, rng: random.Random) -> float:
        fit = self._fit
        if fit is None:
            return self.mean_ms
        mu, sigma = fit
        lo, hi = self.bounds_ms
        f_lo, f_hi = _N.cdf((math.log(lo) - mu) / sigma), _N.cdf((math.log(hi) - mu) / sigma)
        u = f_lo + (f_hi - f_lo) * rng.random()
        u = min(max(u, 1e-15), 1 - 1e-15)
        return min(max(math.exp(mu + sigma * _N.inv_cdf(u)), lo), hi)


def truncated_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    if b < -25 or a > 25:  # all the mass beyond one end (erfc underflows)
        return hi if b < -25 else lo
    # In the upper tail, differences of upper-tail probabilities keep their digits.
    between = (lambda x, y: _upper(x) - _upper(y)) if a > 0 else (lambda x, y: _upper(-y) - _upper(-x))  # noqa: E731
    mass = between(a, b)
    if mass <= 0:
        return hi if b <= 0 else lo  # all the mass lies beyond one end
    return min(max(math.exp(mu + sigma * sigma / 2) * between(a - sigma, b - sigma) / mass, lo), hi)


def _upper(x: float) -> float:
    """P(Z > x) for a standard normal, accurate far into the tail (erfc, not 1 - erf)."""
    return 0.5 * math.erfc(x / math.sqrt(2.0))


@functools.lru_cache(maxsize=2)
def load_pairs(path: str = str(DATA_PATH)) -> dict[tuple[str, str], tuple]:
    """(cty1, cty2) with cty1 <= cty2 -> (count, mean, std, min, max). A pair of one ping has no
    std in the file: 0 here. Rows of unplaced addresses ("None") are left out."""
    with gzip.open(path, "rt", newline="") as f:
        return {
            (row["cty1"], row["cty2"]): (
                int(row["rtt_cnt"]),
                float(row["rtt_avg"]),
                float(row["rtt_std"] or 0),
                float(row["rtt_min"]),
                float(row["rtt_max"]),
            )
            for row in csv.DictReader(f)
            if _is_code(row["cty1"]) and _is_code(row["cty2"])
        }


def _is_code(code: str) -> bool:
    """Addresses iptoasn could not place are listed under "None": not a country."""
    return len(code) == 2 and code.isalpha() and code.isupper()


@functools.lru_cache(maxsize=2)
def countries(path: str = str(DATA_PATH)) -> frozenset[str]:
    return frozenset(c for pair in load_pairs(path) for c in pair)


def pair_stats(edge_country: str, cloud_country: str, path: str = str(DATA_PATH)) -> PairStats:
    """The pair's statistics; ValueError naming the key for an unknown country or pair."""
    known = countries(path)
    for key, code in (("edge_country", edge_country), ("cloud_country", cloud_country)):
        if not isinstance(code, str) or code.upper() not in known:
            raise ValueError(
                f"{key} must be an ISO 3166 alpha-2 code measured in {Path(path).name} "
                f"({len(known)} countries, e.g. 'US', 'DE', 'IN'), got {code!r}"
            )
    a, b = sorted((edge_country.upper(), cloud_country.upper()))
    row = load_pairs(path).get((a, b))
    if row is None:
        raise ValueError(f"edge_country/cloud_country: no measurements between {a} and {b} in {Path(path).name}")
    return PairStats(edge_country.upper(), cloud_country.upper(), *row)
