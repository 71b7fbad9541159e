"""Context parallelism across ranks (:mod:`kernels.prefill.multi_gpu`) with the gloo backend:
2, 3 and 4 CPU processes (``torch.multiprocessing``) under the Triton interpreter, each
holding a contiguous slice of the packed tokens, against the float32 reference of the whole
call.

Cheap by construction: one spawn of four processes runs every case (the two- and three-rank
cases on groups of the first ranks, so ``group=`` is not the default group there), every
rank holds at
most four chunks, and the parent computes the references while the ranks run. The cases
cover sequences that start, end, straddle or lie inside a rank (one spanning a whole rank,
where its transition ``M`` crosses the link; at 4 ranks one through every rank, at D = 16
and D = 128), boundaries inside and between chunks, empty
sequences on rank boundaries, ``D = 16`` and ``D = 128``, with and without initial states,
slow decays (the state carries across ranks), the device guard of an invalid
``cu_seqlens``, and calls padded to whole chunks per rank (a padding sequence last, cut by
:func:`even_bounds`) where the ranks past the real tokens hold only padding (at 2, 3 and 4
ranks; one token per rank at 4; D = 128 at 2). On a CUDA host, three gloo ranks sharing
one GPU at the contest's heads (the GPU's kernels); on a host with two GPUs, two NCCL ranks
as well (skipped elsewhere).
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from kernels.checks import check_outputs  # noqa: E402
from kernels.prefill.config import ACCURATE_CONFIG  # noqa: E402
from kernels.prefill.multi_gpu import (end_rank_process, even_bounds, exchange_bytes,  # noqa: E402
                                      prefill_multi_gpu)
from kernels.reference import prefill_reference  # noqa: E402
from kernels.spec import CONTEST as CONTEST_SHAPE, GDNShape, make_prefill_inputs  # noqa: E402

S16 = GDNShape(1, 1, 16)
G2 = GDNShape(1, 2, 16)            # two value heads per q/k head
S128 = GDNShape(1, 1, 128)

# (shape, lens, bounds, with_state, slow decay, padded, what it covers); padded: the last
# sequence is padding (zero tokens, zero initial state: :func:`_inputs`) that brings the call
# to a whole number of chunks per rank, the bounds those of :func:`even_bounds`, as a caller
# pads a short call; the ranks past the real tokens then hold only padding
CASES = {
    2: [
        (G2, [100, 0, 150, 70], [0, 150, 320], True, False, False,
         "cut inside a chunk and a sequence; an empty sequence inside rank 0"),
        (S128, [200], [0, 130, 200], True, True, False,
         "D=128: one sequence straddling, two segments on rank 0, initial state"),
        (S16, [64, 64], [0, 64, 128], False, False, False, "invalid cu_seqlens, device guard"),
        (S16, [40, 88], even_bounds(128, 2), True, False, True,
         "padding: rank 1 holds only padding (the padding sequence straddles)"),
        (S128, [64, 64], even_bounds(128, 2), True, True, True,
         "D=128 padding: it starts on rank 1's first token, rank 1 holds only it"),
    ],
    3: [
        (S16, [40, 330, 20], [0, 100, 260, 390], False, True, False,
         "a sequence through all ranks, rank 1 inside it (two segments, M exchanged)"),
        (G2, [64, 0, 64, 0, 64], [0, 64, 128, 192], True, False, False,
         "sequences ending on rank boundaries, empty ones there"),
        (G2, [30, 0, 20, 142], even_bounds(192, 3), True, True, True,
         "padding: ranks 1 and 2 hold only padding, rank 1 inside it, slow decay"),
    ],
    4: [
        (S16, [30, 250, 40], [0, 64, 128, 256, 320], False, True, False,
         "a sequence through all four ranks, ranks 1 and 2 inside it, slow decay"),
        (S128, [260], [0, 64, 128, 192, 260], True, True, False,
         "D=128: one sequence straddling every rank, initial state"),
        (S16, [2, 2], even_bounds(4, 4), True, True, True,
         "padding: one token per rank, ranks 2 and 3 hold only padding"),
        (S16, [64, 0, 192], even_bounds(256, 4), True, True, True,
         "padding from rank 1's first token (an empty sequence there): ranks 1-3 hold only it"),
    ],
}
#: processes spawned: the largest group (the smaller ones are groups of its first ranks)
WORLD = max(CASES)


#: The case each rank calls twice (the second call replays the recorded launches).
REPEAT = (3, 0)


def _inputs(shape, lens, with_state, slow, padded):
    x = make_prefill_inputs(lens, shape, seed=3, with_state=with_state)
    if slow:   # decay ~0.99 per token: the state carries across the ranks
        x["A_log"] = torch.full_like(x["A_log"], -4.6)
    if padded:   # the last sequence is padding: zero tokens, zero initial state
        for n in ("q", "k", "v", "a", "b"):
            x[n][sum(lens) - lens[-1]:] = 0
        if with_state:
            x["state"][-1] = 0
    return x


def _padding_only_ranks(case) -> list:
    """The ranks of a padded case that hold no real token (only the padding sequence's)."""
    shape, lens, bounds, *_ = case
    return [r for r in range(len(bounds) - 1) if bounds[r] >= sum(lens) - lens[-1]]


def _invalid(case) -> bool:
    return case[-1].startswith("invalid")


def _fast_repeat(mine, bounds, group):
    """Two calls (values unchecked) with the fastcall stub serving (CPU): the second by the
    rank's two plans, the gloo exchange between them. ``(served, same bits as the first
    call)``; None without the stub build."""
    from kernels import fastcall, interpret
    from kernels.prefill import multi_gpu

    if not interpret.INTERPRET or fastcall._compiler() is None or fastcall.load() is None:
        return None
    outs, served = [], []
    with fastcall.serving_stub():
        for _ in range(2):
            f = multi_gpu._LAST
            n = f is not None and fastcall.stub_last(f.plan2)
            args = {n_: t.clone() if isinstance(t, torch.Tensor) else t for n_, t in mine.items()}
            outs.append(prefill_multi_gpu(**args, bounds=bounds, group=group,
                                          check_values=False))
            f2 = multi_gpu._LAST
            served.append(f2 is not None and f2 is f and fastcall.stub_last(f.plan2) is not n)
    (o1, h1), (o2, h2) = outs
    return served == [False, True], torch.equal(o1, o2) and torch.equal(h1, h2)


def _worker(rank, init, out):
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    groups = {w: dist.new_group(list(range(w))) for w in CASES if w < WORLD}
    groups[WORLD] = dist.group.WORLD
    results = {}
    for world, cases in CASES.items():
        if rank >= world:
            continue
        for i, case in enumerate(cases):
            shape, lens, bounds, with_state, slow, padded, _ = case
            x = _inputs(shape, lens, with_state, slow, padded)
            if _invalid(case):
                x["cu_seqlens"] = torch.tensor([0, 70, 100])           # ends short of T
            t0, t1 = bounds[rank], bounds[rank + 1]
            mine = {n: (t[t0:t1] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
            before = {n: t.clone() for n, t in mine.items() if isinstance(t, torch.Tensor)}
            o, ht = prefill_multi_gpu(**mine, bounds=bounds, group=groups[world],
                                      check_values=not _invalid(case),
                                      config=ACCURATE_CONFIG if slow else None)
            untouched = all(torch.equal(mine[n], t) for n, t in before.items())
            if (world, i) == REPEAT:   # the launches recorded above, replayed: same bits
                o2, ht2 = prefill_multi_gpu(**{n: t.clone() if isinstance(t, torch.Tensor)
                                               else t for n, t in mine.items()},
                                            bounds=bounds, group=groups[world],
                                            check_values=True,
                                            config=ACCURATE_CONFIG if slow else None)
                results["repeat", rank] = torch.equal(o, o2) and torch.equal(ht, ht2)
                results["fast", rank] = _fast_repeat(mine, bounds, groups[world])
            dist.all_reduce(ht, group=groups[world])   # each final state from its sequence's rank
            results[world, i] = (o, ht, untouched)
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()
    end_rank_process()   # (its docstring: a teardown abort seen under load)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Every case's ``(output slice, summed final states, inputs untouched)`` per rank."""
    tmp = tmp_path_factory.mktemp("ranks")
    ctx = mp.start_processes(_worker, args=(tmp / "init", tmp / "out"), nprocs=WORLD, join=False,
                             start_method="spawn")
    try:
        refs = {(w, i): None if _invalid(c) else prefill_reference(
                    **_inputs(*c[:2], *c[3:6]))
                for w, cases in CASES.items() for i, c in enumerate(cases)}
    finally:
        while not ctx.join():
            pass
    return [torch.load(tmp / f"out.{r}") for r in range(WORLD)], refs


def test_a_repeat_call_replays_the_same_bits(ranks):
    """Each rank's second call of a signature (its launches recorded on the first, the
    exchange between the two halves) gives the first call's bits."""
    per_rank, _ = ranks
    assert all(per_rank[r]["repeat", r] for r in range(REPEAT[0]))


def test_a_repeat_served_by_the_rank_plans_gives_the_same_bits(ranks):
    """With the fastcall stub serving (CPU), each rank's second call of a signature is
    served by its two plans (kernels.fastcall), the gloo exchange between them: the bits of
    the first call (the recorded Python path)."""
    per_rank, _ = ranks
    got = [per_rank[r]["fast", r] for r in range(REPEAT[0])]
    if None in got:
        pytest.skip("no fastcall stub build here")
    assert got == [(True, True)] * REPEAT[0], got


@pytest.mark.parametrize("world", sorted(CASES))
def test_ranks_match_reference(world, ranks):
    per_rank, refs = ranks
    for i, case in enumerate(CASES[world]):
        got = [per_rank[r][world, i] for r in range(world)]
        o, ht = torch.cat([g[0] for g in got]), got[0][1]
        assert all(g[2] for g in got), f"{case[-1]}: an input was modified"
        ref = refs[world, i]
        if ref is None:
            assert o.float().isnan().all() and ht.isnan().all(), case[-1]
            continue
        res = check_outputs((o, ht), ref)
        assert res.ok, f"{case[-1]}: {res.reason} (max abs {res.max_abs_err:.3e})"


def test_padded_cases_have_padding_only_ranks():
    """Each padded case has ranks that hold only padding (and at 2, 3 and 4 ranks)."""
    padded = {w: [c for c in cases if c[5]] for w, cases in CASES.items()}
    assert all(padded.values())
    for w, cases in padded.items():
        for c in cases:
            assert _padding_only_ranks(c), c[-1]
            assert c[2] == even_bounds(sum(c[1]), w), c[-1]


def test_even_bounds_and_bytes():
    assert even_bounds(1000, 2) == [0, 512, 1000]
    assert even_bounds(3, 3) == [0, 1, 2, 3]
    assert even_bounds(1 << 20, 4) == [0, 1 << 18, 1 << 19, 3 << 18, 1 << 20]
    with pytest.raises(ValueError, match="world_size"):
        even_bounds(2, 3)
    assert exchange_bytes(8, 128, 2) == 2 * 8 * 2 * 128 * 128 * 4


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("edit, exc, match", [
    (dict(bounds=[0, 40]), ValueError, "q must hold"),
    (dict(bounds=[0, 20, 49]), ValueError, "world_size"),
    (dict(bounds=(0, 49.0)), ValueError, "ints"),
    (dict(bounds=torch.tensor([0, 49])), TypeError, "bounds"),
    (dict(cu_seqlens=torch.tensor([0, 40, 48])), ValueError, "cu_seqlens"),
    (dict(state=torch.zeros(3, 1, 16, 16)), ValueError, "state"),
])
def test_bad_input_raises_before_launch(one_rank, edit, exc, match):
    x = make_prefill_inputs([40, 9], S16, seed=0)
    kw = dict(x, bounds=[0, 49])
    kw.update(edit)
    with pytest.raises(exc, match=match):
        prefill_multi_gpu(**kw)


def _cuda_worker(rank, init, out, lens, bounds, backend="nccl"):
    """One rank on CUDA: its own GPU with NCCL, or GPU 0 shared with the others (gloo)."""
    dev = torch.device("cuda", rank if backend == "nccl" else 0)
    torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank,
                            world_size=len(bounds) - 1)
    try:   # (gloo: whether this torch gathers CUDA tensors into one at all)
        probe = torch.ones(2, device=dev)
        dist.all_gather_into_tensor(torch.empty(2 * (len(bounds) - 1), device=dev), probe)
    except (RuntimeError, NotImplementedError) as e:
        torch.save(f"{backend} cannot all-gather CUDA tensors here: {e}"[:300], f"{out}.{rank}")
        dist.destroy_process_group()
        return
    x = {n: (t.to(dev) if isinstance(t, torch.Tensor) else t)
         for n, t in make_prefill_inputs(lens, CONTEST_SHAPE, seed=5).items()}
    t0, t1 = bounds[rank], bounds[rank + 1]
    mine = {n: (t[t0:t1] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
    o, ht = prefill_multi_gpu(**mine, bounds=bounds)       # no host check: the device guard
    dist.all_reduce(ht)
    torch.save((o.cpu(), ht.cpu()), f"{out}.{rank}")
    dist.destroy_process_group()
    end_rank_process()   # (its docstring: a teardown abort seen under load)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL)")
def test_two_gpus_match_reference(tmp_path):
    """Two NCCL ranks on two GPUs at the contest's heads: one sequence straddling them, one on
    each, one long enough for the long path's 16 segments per rank."""
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                 ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[k] = v
    lens, bounds = [3000, 60000, 2536], [0, 32768, 65536]
    _check_cuda_ranks(tmp_path, lens, bounds, "nccl")


def _check_cuda_ranks(tmp_path, lens, bounds, backend):
    from kernels.reference import prefill_reference_chunked

    W = len(bounds) - 1
    mp.start_processes(_cuda_worker, args=(tmp_path / "init", tmp_path / "out", lens, bounds,
                                           backend),
                       nprocs=W, join=True, start_method="spawn")
    got = [torch.load(tmp_path / f"out.{r}") for r in range(W)]
    if any(isinstance(g, str) for g in got):
        pytest.skip(next(g for g in got if isinstance(g, str)))
    x = {n: (t.cuda() if isinstance(t, torch.Tensor) else t)
         for n, t in make_prefill_inputs(lens, CONTEST_SHAPE, seed=5).items()}
    ref = prefill_reference_chunked(**x)
    res = check_outputs((torch.cat([g[0] for g in got]).cuda(), got[0][1].cuda()), ref)
    assert res.ok, f"{res.reason} (max abs {res.max_abs_err:.3e})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_three_ranks_sharing_one_gpu_match_reference(tmp_path):
    """Three gloo ranks on one GPU (the GPU's kernels, Gluon phase C on sm_90, with a host
    collective: what one lent GPU can check of the multi-GPU call): a sequence through all
    three (rank 1 inside it; rank 2 folds two earlier maps), the last one starting on rank
    2, the contest's heads, 16 segments per rank."""
    _check_cuda_ranks(tmp_path, [40000, 9152], [0, 16384, 32768, 49152], "gloo")
