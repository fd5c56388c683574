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


# ---- collectives as NCCL runs them on a cluster of nodes ------------------------------------------
#
# A group of E ranks whose consecutive members are `stride` global ranks apart (mesh.py: TP stride
# 1, CP stride tp, PP stride tp·cp, DP stride tp·cp·pp) has g = min(E, gpus_per_node / stride)
# members in each node and spans N = E / g nodes.
# - Inside one node (N = 1): a ring over NVLink/NVSwitch at the achieved NVLink bandwidth.
# - Across nodes: NCCL runs one ring per channel, each channel leaving a node through one NIC, so
#   a node's link to the rest carries the whole ring traffic (E-1)/E·n (×2 for all-reduce) through
#   the NICs its g members own: bandwidth g × (per-GPU NIC share) × NIC efficiency.  Inside the
#   node the same traffic moves over NVLink; the two stages pipeline, so the bandwidth term is the
#   slower of the two — the group's real bottleneck.  A group with one member per node (TP inside
#   nodes, DP across them) is thus priced at one GPU's NIC share, a group of all eight GPUs of each
#   node at the whole node's NICs (hierarchical reduction).
# - Latency: a ring pays (E-1) steps (α of the slowest link); NCCL's tree all-reduce pays
#   2·log2(N) inter-node and 2(g-1) intra-node steps at about the ring's bandwidth; NCCL picks the
#   faster by message size, so the all-reduce here is the smaller of the two.  All-gather and
#   reduce-scatter are rings.

def _group_shape(e: int, stride: int, gpn: int) -> tuple[int, int]:
    """(members per node g, nodes spanned N) of a group of e ranks `stride` apart."""
    g = max(1, min(e, gpn // max(stride, 1)))
    return g, -(-e // g)


def collective(kind: str, nbytes: float, e: int, stride: int, cluster) -> Cost:  # cluster: hardware.Cluster
    """Time of one collective on `cluster` (kind: all_reduce, all_gather, reduce_scatter).

    With `cluster.hier` False this is the seed's flat ring over the slowest link crossed.
    """
    if e <= 1:
        return ZERO
    return _collective(kind, float(nbytes), e, max(stride, 1), cluster)


_CACHE: dict[tuple, Cost] = {}


def _collective(kind: str, nbytes: float, e: int, stride: int, cluster) -> Cost:
    key = (kind, nbytes, e, stride, cluster)
    try:
        hit = _CACHE.get(key)
    except TypeError:  # a cluster whose profile holds unhashable fields: price without the cache
        key, hit = None, None
    if hit is not None:
        return hit
    from .hardware import NIC_EFF, mesh_share, nvlink_eff

    factor = 2.0 if kind == "all_reduce" else 1.0
    gpn = cluster.gpus_per_node
    span = e * stride
    if not cluster.hier:
        link = cluster.intra if span <= gpn else cluster.inter
        out = all_reduce(nbytes, e, link) if kind == "all_reduce" else reduce_scatter(nbytes, e, link)
    else:
        g, nodes = _group_shape(e, stride, gpn)
        vol = factor * (e - 1) / e * nbytes  # what each rank sends (ring) = what crosses each cut
        # inside one node NVLink SHARP may run the all-reduce (NVLink 4+); across nodes the rings
        nvl = cluster.intra.beta * nvlink_eff(cluster.intra.name, kind if nodes <= 1 else "ring")
        nvl *= mesh_share(cluster.intra.name, g)  # a mesh (AMD's Infinity Fabric): the links to the other members
        if nodes <= 1:
            out = Cost(factor * (e - 1) * cluster.intra.alpha, vol / nvl)
        else:
            nic = g * cluster.inter.beta * NIC_EFF  # the group's share of one node's NICs
            beta = max(vol / nic, vol / nvl if g > 1 else 0.0)
            a_ring = factor * (e - 1) * max(cluster.inter.alpha, cluster.intra.alpha)
            if kind == "all_reduce":
                import math

                a_tree = 2 * math.ceil(math.log2(nodes)) * cluster.inter.alpha + 2 * (g - 1) * cluster.intra.alpha
                out = Cost(min(a_ring, a_tree), beta)
            else:
                out = Cost(a_ring, beta)
    if key is not None:
        if len(_CACHE) > 200_000:
            _CACHE.clear()
        _CACHE[key] = out
    return out


def send_recv(nbytes: float, stride: int, cluster, span: int) -> Cost:
    """Point-to-point between group neighbours `stride` ranks apart, the group spanning `span` ranks:
    NVLink when the group is inside one node, else the sender's NIC share (the boundaries that
    cross nodes set the pace; every GPU of a node sends at once, so each has its share).  Flat
    (seed) clusters: the link of the group's span."""
    from .hardware import NIC_EFF, mesh_share, nvlink_eff

    if not cluster.hier:
        return p2p(nbytes, cluster.link_for_span(span))
    if span <= cluster.gpus_per_node:  # the whole group inside one node (a mesh: the one link between the pair)
        name = cluster.intra.name
        return Cost(cluster.intra.alpha, nbytes / (cluster.intra.beta * nvlink_eff(name, "p2p") * mesh_share(name, 2)))
    return Cost(cluster.inter.alpha, nbytes / (cluster.inter.beta * NIC_EFF))


def all_to_all(nbytes: float, e: int, cluster, remote_nodes: float | None = None,
               token_bytes: float = 0.0, stride: int = 1) -> Cost:  # cluster: hardware.Cluster
    """A mixture of experts' token exchange (dispatch or combine) over an expert-parallel group of e ranks, each
    sending `nbytes` spread evenly over the group (balanced routing), (e - 1)/e of it to the others.

    The group is placed as Megatron-Core's rank order places it (expert ranks innermost with expert-tensor-parallel
    size 1: `ep` consecutive ranks), g = min(e, gpus_per_node) of them in each node.  Every rank sends to every
    other at once (one kernel: NCCL's grouped send/recv, DeepEP's and HybridEP's dispatch), so there is no ring:
    its share for the g - 1 node-mates moves over NVLink, its share for the e - g others through its own NIC
    (rail-optimised, each GPU its NIC), the two in parallel: the slower sets the time, plus one latency of the
    slowest link crossed.  Flat (seed) clusters: the link of the group's span.  The achieved shares are the
    collectives' (NVLink's point-to-point share, NIC_EFF): DeepEP's published normal-kernel figures reach about
    that on H800 NVLink and 400 Gb/s RDMA.

    `remote_nodes` given (a node-deduplicating dispatch: DeepEP's and HybridEP's): each token crosses the NICs once
    per remote node its copies go to -- `remote_nodes` × `token_bytes` -- and is forwarded inside that node over
    NVLink, so NVLink carries every copy that leaves the GPU, (e - 1)/e of `nbytes`, and the NIC `remote_nodes`
    copies of each token (cp_ep_comm.ep_remote_nodes counts them) instead of (e - g)/e of every copy.

    `stride`: the group's members are that many ranks apart (a context-parallel group, tp ranks apart in the
    mesh: cp_ep_comm.cp_all_to_all), so a node holds gpus_per_node / stride of them (at least one)."""
    if e <= 1:
        return ZERO
    from .hardware import NIC_EFF, mesh_share, nvlink_eff

    if not cluster.hier:
        link = cluster.link_for_span(e * stride)
        return Cost(link.alpha, (e - 1) / e * nbytes / link.beta)
    g = max(1, min(e, cluster.gpus_per_node // stride))
    nvl = cluster.intra.beta * nvlink_eff(cluster.intra.name, "p2p") * mesh_share(cluster.intra.name, g)
    intra = (g - 1) / e * nbytes / nvl
    if g >= e:
        return Cost(cluster.intra.alpha, intra)
    if remote_nodes is not None:  # deduplicated per node, forwarded over NVLink
        intra = (e - 1) / e * nbytes / nvl
        inter = remote_nodes * token_bytes / (cluster.inter.beta * NIC_EFF)
        return Cost(max(cluster.inter.alpha, cluster.intra.alpha), max(intra, inter))
    inter = (e - g) / e * nbytes / (cluster.inter.beta * NIC_EFF)
    return Cost(max(cluster.inter.alpha, cluster.intra.alpha), max(intra, inter))
