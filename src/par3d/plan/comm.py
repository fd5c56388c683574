"""α-β costs of collectives (seed §3.1 and §4.5; Thakur, Rabenseifner & Gropp 2005 for the rings).

A message of n bytes over a link costs T = α + n/β.  The ring algorithms over E ranks:
- all-reduce:      2(E-1)·α + 2(E-1)/E · n/β     (reduce-scatter followed by all-gather)
- reduce-scatter:   (E-1)·α +  (E-1)/E · n/β
- all-gather:       (E-1)·α +  (E-1)/E · n/β     (n = the size of the gathered tensor)
β is the per-GPU, one-direction bandwidth of the slowest link the ring crosses.
Every function returns a `Cost` so reports can show the latency (α) and bandwidth (β) terms apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import Link


@dataclass(frozen=True)
class Cost:
    alpha: float = 0.0  # seconds of latency terms
    beta: float = 0.0  # seconds of bandwidth terms

    @property
    def total(self) -> float:
        return self.alpha + self.beta

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.alpha + other.alpha, self.beta + other.beta)

    def __mul__(self, k: float) -> Cost:
        return Cost(self.alpha * k, self.beta * k)

    __rmul__ = __mul__


ZERO = Cost()


def all_reduce(nbytes: float, e: int, link: Link) -> Cost:
    """Ring all-reduce: 2(E-1)α + 2(E-1)/E·n/β (seed §3.1, §4.2)."""
    if e <= 1:
        return ZERO
    return Cost(2 * (e - 1) * link.alpha, 2 * (e - 1) / e * nbytes / link.beta)


def reduce_scatter(nbytes: float, e: int, link: Link) -> Cost:
    """Ring reduce-scatter of an n-byte tensor: (E-1)α + (E-1)/E·n/β."""
    if e <= 1:
        return ZERO
    return Cost((e - 1) * link.alpha, (e - 1) / e * nbytes / link.beta)


def all_gather(nbytes: float, e: int, link: Link) -> Cost:
    """Ring all-gather producing an n-byte tensor: (E-1)α + (E-1)/E·n/β."""
    return reduce_scatter(nbytes, e, link)


def p2p(nbytes: float, link: Link) -> Cost:
    """Point-to-point send: α + n/β (seed §4.5)."""
    return Cost(link.alpha, nbytes / link.beta)
