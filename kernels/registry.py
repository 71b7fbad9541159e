"""Every implementation a notebook runs, resolved in one place into one record type.

An ``impls`` list (a notebook's parameter) names ours (each notebook's own forms: ``ours``,
``ours-adaptive``, ``ours:<config>``, ...), the peers of :data:`kernels.peers.PEERS` (any
peer of the notebook's op) and ``solution:<path>`` entries; the ``solutions`` parameter adds
paths (``make run SOLUTIONS=...``), kept when their definition is the notebook's op.
:func:`resolve` turns them into :class:`Impl` records:

==========  =====================================================  =====================
kind        what                                                   runs
==========  =====================================================  =====================
ours        our kernels (the notebook builds them: :func:`ours`)   this process
peer        :mod:`kernels.peers` (FLA, FlashInfer, torch)          this process
worker      peers with ``worker=True`` (FlashQLA, tilelang's site)  :mod:`kernels.peers_worker`
solution    flashinfer-bench solutions                             a worker each
                                                                   (:mod:`kernels.contest.remote`)
==========  =====================================================  =====================

An implementation that cannot run here is a record too, falsy, with a one-line ``reason``:
the notebooks report it (status ``unavailable``) and the runner's summary lists it. Adding a
peer is one row of :data:`kernels.peers.PEERS` (docs/architecture.md, "Adding an
implementation"); nothing here or in a notebook names peers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from .contest.formats import SOLUTION_PREFIX

__all__ = ["KINDS", "Impl", "ours", "peers", "solutions", "resolve", "gate",
           "is_solution", "solution_entries"]

KINDS = ("ours", "peer", "worker", "solution")


@dataclass(frozen=True, eq=False)
class Impl:
    """One implementation of a notebook.

    ``label``: its row in tables and legends (unique in a notebook, but for the variants of
    one peer). ``kind``: one of :data:`KINDS`. ``op``: ``decode`` or ``prefill``. ``name``:
    what it is called where it comes from (``ours``, the peer's :mod:`kernels.peers` name,
    the solution's path). ``fn``: the callable in this process
    (ours, peer), or the handle of a worker (``worker``, ``solution``: ``fn.run(...)`` gates
    and times there); ``None`` when unavailable, then ``reason`` says why in one line.
    ``variant``: ours' variant or config, or how a peer is called (``default``,
    ``inplace``). ``info``: provenance (a solution's origin, language, build).
    """

    label: str
    kind: str
    op: str
    name: str
    fn: Optional[Callable] = None
    reason: str = ""
    variant: str = "default"
    info: Mapping = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.fn is not None

    @property
    def impl(self) -> str:
        """The ``impl`` column of its rows: ``solution`` for a solution (its name is the
        ``label``), else ``name``."""
        return "solution" if self.kind == "solution" else self.name

    @property
    def where(self) -> str:
        """``process`` (called here) or ``worker`` (gated and timed in a worker process)."""
        return "worker" if self.kind in ("worker", "solution") else "process"


def ours(label: str, build: Callable[[], Callable], *, op: str, variant: str = "default",
         name: str = "ours") -> Impl:
    """Our implementation ``build()`` makes; an exception there becomes its reason."""
    from .bench.gate import short_reason

    try:
        return Impl(label, "ours", op, name, build(), variant=variant)
    except Exception as e:
        return Impl(label, "ours", op, name, None, short_reason(e), variant=variant)


def peers(names: Iterable[str], op: str, *, in_process: bool = False,
          variants: Optional[Mapping[str, Sequence[tuple]]] = None) -> List[Impl]:
    """Records of the ``op`` peers ``names``, in order: those of the peer worker from the
    worker (started here), the others built in this process. ``in_process``: refuse the
    worker's (a section that calls its implementations here). ``variants``: ``{name:
    ((variant, peer name), ...)}``, one peer gated and timed as several of
    :mod:`kernels.peers`' (FlashInfer's decode with and without its state copy)."""
    from .peers import PEERS, peer_impls

    rows = {p.name: p for p in PEERS if p.op == op}
    worker = {p.name for p in rows.values() if p.worker}
    names = list(names)
    if in_process:
        bad = [n for n in names if n in worker]
        if bad:
            raise ValueError(f"{bad} run in the peer worker, not in this process")
    calls = [(n, v, p) for n in names for v, p in (variants or {}).get(n, (("default", n),))]
    local = [p for _, _, p in calls if p not in worker]
    found: Dict[str, object] = dict(peer_impls(op, local)) if local else {}
    remote = [p for _, _, p in calls if p in worker]
    if remote:
        from .peers_worker import remote_prefill_impls

        found.update(remote_prefill_impls(remote))
    out = []
    for n, v, p in calls:
        fn = found[p]
        label = rows[n].label if n in rows else n
        kind = "worker" if p in worker else "peer"
        out.append(Impl(label, kind, op, p, fn if fn else None,
                        "" if fn else fn.reason, variant=v))
    return out


def is_solution(entry) -> bool:
    """Whether an ``impls`` entry names a solution (``solution:<path>``)."""
    return isinstance(entry, str) and entry.startswith(SOLUTION_PREFIX)


def solution_entries(params: Mapping) -> tuple:
    """``(explicit, added)``: the ``solution:`` entries of ``params["impls"]`` and the
    paths of ``params["solutions"]`` (what ``make run SOLUTIONS=...`` passes)."""
    explicit = [e for e in params.get("impls", []) if is_solution(e)]
    return explicit, list(params.get("solutions") or [])


def solutions(params: Mapping, op: str, taken: Iterable[str] = ()) -> List[Impl]:
    """Records of the solutions of ``params`` (:func:`solution_entries`) of ``op``, each
    loaded in a worker of its own (:func:`kernels.contest.remote.remote_solutions`), labelled
    by its name made unique against ``taken``."""
    explicit, added = solution_entries(params)
    if not (explicit or added):
        return []
    from .contest.remote import describe, remote_solutions

    sols = remote_solutions(explicit, added, op=op, taken=taken)
    out = []
    for (label, handle), info in zip(sols.items(), describe(sols)):
        out.append(Impl(label, "solution", op, info.get("origin", ""),
                        handle if handle else None, "" if handle else handle.reason,
                        info=info))
    return out


def resolve(params: Mapping, op: str, *, ours_of: Callable[[str], Optional[List[Impl]]],
            known_ours: str, variants: Optional[Mapping[str, Sequence[tuple]]] = None
            ) -> List[Impl]:
    """Every implementation of ``params["impls"]`` in its order, then the solutions.

    ``ours_of(entry)``: the notebook's records of one of its own entries, ``None`` for an
    entry that is not ours; ``known_ours`` lists those entries in the error for an entry
    that is nothing known (a ``ValueError`` before anything runs). ``variants``: see
    :func:`peers`."""
    from .peers import PEERS

    known_peers = [p.name for p in PEERS if p.op == op]
    entries = list(params["impls"])
    mine = {e: ours_of(e) for e in entries if not is_solution(e) and e not in known_peers}
    unknown = [e for e, r in mine.items() if r is None]
    if unknown:
        raise ValueError(f"unknown impls {unknown}; known: {known_ours}, "
                         f"{', '.join(known_peers)}, solution:<path>")
    peer_entries = [e for e in entries if e in known_peers]
    found = iter(peers(peer_entries, op, variants=variants))
    per_peer = {e: [next(found) for _ in (variants or {}).get(e, ("default",))]
                for e in peer_entries}
    out: List[Impl] = []
    for e in entries:
        if not is_solution(e):
            out += mine[e] if e in mine else per_peer[e]
    return out + solutions(params, op, taken={r.label for r in out} | set(entries))


def gate(impl: Impl, key: str, inputs: dict, reference, device) -> dict:
    """The gate row of ``impl`` on ``inputs``: :func:`kernels.bench.gate.gate_call` here, or
    in its worker (``key`` names the inputs there). A worker that dies raises (the caller
    reports it as the row's ``error``)."""
    from .bench.gate import gate_call

    if impl.where == "worker":
        return impl.fn.run(key, inputs, reference, device=device)["gate"]
    return gate_call(impl.fn, inputs, reference, device)
