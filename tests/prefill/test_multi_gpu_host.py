"""The host path of one rank's :func:`kernels.prefill.multi_gpu.prefill_multi_gpu` call: the
rank's indices (one kernel) against the torch expressions they replace, the entering
states' copy, the rank plan remembered per key, and a call's host work (no host sync, one
workspace allocation besides the outputs) on torch's ``fake`` process group (no peer: the
all-gather returns at once). Correctness across ranks: ``tests/prefill/test_multi_gpu.py``.
"""
from __future__ import annotations

import os
from contextlib import nullcontext

os.environ.setdefault("TRITON_INTERPRET", "0" if __import__("torch").cuda.is_available() else "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from kernels import interpret  # noqa: E402
from kernels.prefill import multi_gpu  # noqa: E402
from kernels.spec import GDNShape, make_prefill_inputs  # noqa: E402
from tests.test_fastcall import _expected_params  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _torch_indices(cu, t0, t1, T, guard):
    """What the rank derived from ``cu_seqlens`` with torch ops before the index kernel."""
    N = cu.numel() - 1
    cu = cu.to(torch.int64)
    cu_local = (cu - t0).clamp_(0, t1 - t0)
    bad = torch.zeros((), dtype=torch.bool)
    if guard:
        bad = ((cu[0] != 0) | (cu[-1] != T) | (cu[1:] < cu[:-1]).any()
               | ((cu < 0) | (cu > T)).any())
        cu_local[0] = -bad.to(torch.int64)
    seqs = (torch.stack([(cu <= t0).sum(), (cu <= t1 - 1).sum()]) - 1).clamp_(0, N - 1)
    starts = cu.index_select(0, seqs)
    meta = torch.stack([seqs[1], (starts[1] >= t0).to(torch.int64), seqs[0],
                        (starts[0] < t0).to(torch.int64)])
    key = torch.where(cu[1:] > cu[:-1], cu[1:] - 1, cu[:-1].clamp(max=T - 1))
    drop = ~(((key >= t0) & (key < t1)) | bad)
    return cu_local, meta, drop


@pytest.mark.parametrize("cu, bounds", [
    ([0, 100, 100, 250, 320], [0, 150, 320]),
    ([0, 40, 370, 390], [0, 100, 260, 390]),
    ([0, 64, 64, 128, 128, 192], [0, 64, 128, 192]),
    ([0, 70, 100], [0, 64, 128]),              # ends short of T
    ([5, 3, 900, 128], [0, 64, 128]),          # decreasing, out of range
])
@pytest.mark.parametrize("guard", [True, False])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_rank_index_kernel_matches_torch(cu, bounds, guard, dtype):
    cu_t = torch.tensor(cu, dtype=dtype, device=DEV)
    N, T = len(cu) - 1, bounds[-1]
    for r in range(len(bounds) - 1):
        t0, t1 = bounds[r], bounds[r + 1]
        want = _torch_indices(cu_t.cpu(), t0, t1, T, guard)
        cu_local = torch.full((N + 1,), 7, dtype=torch.int64, device=DEV)
        meta = torch.full((4,), 7, dtype=torch.int64, device=DEV)
        drop = torch.ones(N, dtype=torch.bool, device=DEV)
        multi_gpu.rank_index_kernel[(1,)](cu_t, cu_local, meta, drop, t0, t1, T, t1 - t0, N,
                                          GUARD=guard, PIECES=True, BLOCK=4)  # BLOCK < N + 1
        for name, got, w in zip(("cu_local", "meta", "drop"), (cu_local, meta, drop), want):
            assert torch.equal(got.cpu(), w), f"{name}, rank {r}: {got.tolist()} != {w.tolist()}"


def _chain_case(last_starts_here: bool, seed: int = 0):
    """A rank (RANK = 2 of 3) holding two sequences' pieces, D = 16, segments of 64 tokens:
    sequence 0 (tokens [0, 120): slots 0-1) continues from the earlier ranks (the first
    piece); with ``last_starts_here`` sequence 1 ([120, 200): slots 3-4) starts here and is
    the last piece, else sequence 0 is also the last (it holds all 200 tokens: slots 0-3).
    Random segment maps (some negligible), the earlier ranks' maps, initial states."""
    g = torch.Generator().manual_seed(seed)
    H, D, S, RANK = 2, 16, 6, 2
    r = lambda *sh: torch.randn(*sh, generator=g)   # noqa: E731
    cu = torch.tensor([0, 120, 200] if last_starts_here else [0, 200, 200])
    meta = torch.tensor([1, 1, 0, 1] if last_starts_here else [0, 0, 0, 1])
    summ = torch.cat([r(S, H, D, D) * 0.3 / D ** 0.5, r(S, H, D, D)], 2)   # [M^T ; X^T]
    negl = (torch.rand(S, H, generator=g) < 0.25).to(torch.int32)
    zs = torch.cat([r(RANK * H, D, D) * 0.3 / D ** 0.5, r(RANK * H, D, D)], 1)
    zs[:H, :D] = 0                                       # rank 0's piece starts there
    h0 = r(2, H, D, D)
    return dict(H=H, D=D, S=S, RANK=RANK, cu=cu, meta=meta, summ=summ, negl=negl, zs=zs,
                h0=h0)


def _chain_reference(c):
    """Every slot's entering state and the last piece's map, float64, step by step."""
    H, D = c["H"], c["D"]
    M = lambda slot, h: (0 if c["negl"][slot, h] else 1) * c["summ"][slot, h, :D].double()  # noqa: E731
    X = lambda slot, h: c["summ"][slot, h, D:].double()   # noqa: E731
    enter = torch.zeros(H, D, D, dtype=torch.float64)
    for r in range(c["RANK"]):
        z = c["zs"][r * H:(r + 1) * H].double()
        enter = enter @ z[:, :D] + z[:, D:]
    s0, mine = {}, torch.zeros(H, 2 * D, D, dtype=torch.float64)
    for n in range(2):
        bos, eos = int(c["cu"][n]), int(c["cu"][n + 1])
        n_c, slot0 = -(-(eos - bos) // 64), bos // 64 + n
        for h in range(H):
            st = enter[h].clone() if n == 0 else c["h0"][n, h].double()
            q = torch.eye(D, dtype=torch.float64)
            for j in range(max(n_c, 1)):
                s0[slot0 + j, h] = st
                if j < n_c:
                    st, q = st @ M(slot0 + j, h) + X(slot0 + j, h), q @ M(slot0 + j, h)
            if n == int(c["meta"][0]):
                from_zero = st - (enter[h] @ q if n == 0 else 0)
                mine[h] = torch.cat([q if n == 0 else torch.zeros_like(q), from_zero])
    return s0, mine


@pytest.mark.parametrize("last_starts_here", [True, False])
def test_rank_chain_and_fix_kernels_give_every_entering_state(last_starts_here):
    """rank_chain_kernel (phase B before the exchange, the continuing first piece from zero,
    its prefix maps, the last piece's [M_r ; F_r]) then rank_fix_kernel (the fold over the
    earlier ranks' maps and S_j += S Q_j): every segment's entering state and the rank's map
    equal a float64 step-by-step chain (bf16 products: to 2e-2)."""
    c = _chain_case(last_starts_here)
    H, D, S = c["H"], c["D"], c["S"]
    to = lambda t: t.to(DEV)   # noqa: E731
    s0 = torch.full((S, H, D, D), float("nan"), device=DEV)
    pref = torch.full((4, H, D, D), float("nan"), device=DEV)
    mine = torch.full((H, 2 * D, D), float("nan"), device=DEV)
    kw = dict(H=H, K=D, V=D, BV=8, SEG_T=64)
    multi_gpu.rank_chain_kernel[(3, H, D // 8)](
        to(c["h0"]), to(c["summ"]), to(c["negl"]), to(c["meta"]), to(c["cu"]), s0, pref, mine,
        200, 2, USE_H0=True, PIECES=True, PREFIX=True, DOT_PREC="tf32x3", **kw)
    mine_zero = mine.clone()
    want_s0, want_mine = _chain_reference(c)
    assert torch.allclose(mine_zero.cpu().double(), want_mine, rtol=2e-2, atol=2e-2)
    multi_gpu.rank_fix_kernel[(4, H, D // 8)](s0, pref, to(c["zs"]), to(c["meta"]),
                                              to(c["cu"]), 200, RANK=c["RANK"],
                                              DOT_PREC="tf32x3", **kw)
    for (slot, h), want in want_s0.items():
        got = s0[slot, h].cpu().double()
        assert torch.allclose(got, want, rtol=2e-2, atol=2e-2), (slot, h)


def test_rank_plan_remembered_per_key():
    multi_gpu.clear_rank_plans()
    args = (4096, 2, 8, 128, 1, 2, 4096, 8192, None, False, True)
    p = multi_gpu.rank_plan(*args)
    assert multi_gpu.rank_plan(*args) is p
    assert multi_gpu.rank_plan(*args[:-1], False) is not p
    assert p.seg_t == 4 * 64 and p.fix is not None   # 64 chunks, one sequence per rank
    assert p.fix[0] == (16, 8, 8) and p.fix[1]["RANK"] == 1   # 16 segments: its grid
    assert p.chain[0] == (3, 8, 8)                            # 2 sequences + the map's
    names = [v[0] for v in p.views]
    assert len(names) == len(set(names)) and {"cu_local", "zs", "pref", "mine"} <= set(names)
    with pytest.raises(TypeError, match="config"):
        multi_gpu.rank_plan(*args[:8], "fast", False, True)


class _Record(TorchDispatchMode):
    """The aten ops of a call; a host sync (``.item()``, ``int(t)``, ``.tolist()``) raises."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("_local_scalar_dense", "_to_copy"):
            raise AssertionError(f"host sync or copy in the call path: {func}")
        self.ops.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def fake_rank1():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=1, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("with_state", [True, False])
def test_call_host_work(fake_rank1, with_state, monkeypatch):
    """Rank 1 of 2 (the fold and the entering states included, in kernels): no host sync, one
    workspace allocation besides the two outputs; the second call plans nothing. (Under
    the interpreter the recorded call's launches are no-ops: the interpreter's own copies
    of the arguments are not the call's. The Python path's work: on CUDA a plan of
    :mod:`kernels.fastcall` would serve the repeat in C, tests/test_fastcall.py checks it.)"""
    monkeypatch.setenv("GDN_FAST_LAUNCH", "0")
    x = make_prefill_inputs([100, 150], GDNShape(1, 2, 16), seed=0, device=DEV,
                            with_state=with_state)
    bounds = [0, 128, 250]
    mine = {n: (t[128:] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
    multi_gpu.clear_rank_plans()
    multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
    assert len(multi_gpu._RANK_PLANS) == 1
    if interpret.INTERPRET:
        from triton.runtime import interpreter

        monkeypatch.setattr(interpreter.InterpretedFunction, "run", lambda *a, **k: None)
    with _Record() as rec:
        multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
    assert len(multi_gpu._RANK_PLANS) == 1
    allocs = [op for op in rec.ops if op in ("empty", "empty_like", "empty_strided", "zeros")]
    assert allocs == ["empty"] * 3, rec.ops           # the workspace, output, final state
    compute = [op for op in rec.ops if op not in ("empty", "as_strided", "view", "detach")
               and "allgather" not in op]
    assert compute == ["masked_fill_"], rec.ops
    assert sum("allgather" in op for op in rec.ops) == 1, rec.ops   # the exchange


def test_workspace_layout_extra_views():
    """The plan's hook for the rank's buffers: ``extra`` views follow the one-GPU ones,
    which stay as they were, each at a multiple of the alignment."""
    from kernels.prefill.plan import WORKSPACE_ALIGN, layout_views, workspace_layout

    base = workspace_layout(1000, 3, 8, 128, 4, True)
    extra = (("cu_local", torch.int64, (4,)), ("drop", torch.bool, (3, 1, 1, 1)))
    got = workspace_layout(1000, 3, 8, 128, 4, True, extra=extra)
    assert got[:len(base)] == base
    assert [(v[0], v[1], v[2], v[4]) for v in got[len(base):]] == [
        ("cu_local", torch.int64, (4,), 32), ("drop", torch.bool, (3, 1, 1, 1), 3)]
    assert all(v[3] % WORKSPACE_ALIGN == 0 for v in got) and got[-1][3] > base[-1][3]
    nbytes, views = layout_views(got)
    assert nbytes % WORKSPACE_ALIGN == 0 and nbytes >= got[-1][3] + got[-1][4]
    assert views[-1] == ("drop", torch.bool, (3, 1, 1, 1), (1, 1, 1, 1), got[-1][3])


@pytest.fixture
def fake_rank0():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


def test_recorded_halves_equal_the_normal_path_bit_for_bit(fake_rank0):
    """Rank 0 of 2 (its results do not read the exchange, which the fake group leaves
    empty): the launches before and after the exchange, recorded on the signature's first
    call, replayed on calls with other tensors and values give the normal path's bits
    (a first call each); checked once per signature."""
    bounds = [0, 128, 250]
    multi_gpu.clear_rank_plans()
    multi_gpu._CALLS.clear()
    for seed in range(3):
        x = make_prefill_inputs([100, 150], GDNShape(1, 2, 16), seed=seed, device=DEV)
        mine = {n: (t[:128] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
        out = multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
        calls = dict(multi_gpu._CALLS)
        multi_gpu._CALLS.clear()
        ref = multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
        multi_gpu._CALLS.clear()
        multi_gpu._CALLS.update(calls)
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    (c,) = multi_gpu._CALLS.values()
    assert [len(x) for x in c.lists] == [4, 1]   # index, intra, A, chain (B + map) | C


def test_rank1_records_the_entering_state_after_the_exchange(fake_rank1):
    """Rank 1 of 2: the entering states' fix opens the second half; bad bounds are still
    rejected on a repeat of the signature."""
    x = make_prefill_inputs([100, 150], GDNShape(1, 2, 16), seed=0, device=DEV)
    mine = {n: (t[128:] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
    multi_gpu._CALLS.clear()
    multi_gpu.prefill_multi_gpu(**mine, bounds=[0, 128, 250], check_values=False)
    (c,) = multi_gpu._CALLS.values()
    assert [len(x) for x in c.lists] == [4, 2]
    assert c.lists[1].names[0] == "rank_fix_kernel"
    for bad, exc in (([0, 128.0, 250], ValueError), ((0, 120, 250), ValueError)):
        with pytest.raises(exc, match="bounds|q must hold"):
            multi_gpu.prefill_multi_gpu(**mine, bounds=bad, check_values=False)


@pytest.fixture
def serving_stub():
    from kernels import fastcall

    if not interpret.INTERPRET:
        pytest.skip("the stub's notes (CPU)")
    if fastcall._compiler() is None or fastcall.load() is None:
        pytest.skip(f"no fastcall extension here ({fastcall.status()['reason']})")
    multi_gpu._CALLS.clear()
    multi_gpu._LAST = None
    with fastcall.serving_stub():
        yield fastcall
    multi_gpu._CALLS.clear()
    multi_gpu._LAST = None


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_plans_serve_repeats_with_the_python_lists_parameters(rank, serving_stub):
    """A signature's first call (values unchecked) makes the two plans (kernels.fastcall,
    the stub build): a repeat with other tensors and values is served by them (the exchange
    between them in Python), their noted parameters the recorded halves' with this call's
    addresses (the workspace the first plan allocated, shared by the second), the outputs
    the normal path's bits (rank 0; rank 1 reads the fake group's empty exchange, so its
    bits are compared on the launches' parameters only)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    fastcall = serving_stub
    dist.init_process_group("fake", rank=rank, world_size=2, store=FakeStore())
    try:
        bounds = [0, 128, 250]
        cut = slice(0, 128) if rank == 0 else slice(128, 250)
        for seed in range(3):
            x = make_prefill_inputs([100, 150], GDNShape(1, 2, 16), seed=seed, device=DEV)
            mine = {n: (t[cut] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
            out = multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
            (c,) = multi_gpu._CALLS.values()
            assert c.fast is not None and multi_gpu._LAST is c.fast
            if seed == 0:
                continue
            f = c.fast
            notes1, srcs1, ws1 = fastcall.stub_last(f.plan1)
            notes2, srcs2, ws2 = fastcall.stub_last(f.plan2)
            assert ws1 is None and ws2 is None
            assert srcs1[3 + 9] is out[0] and srcs1[3 + 10] is out[1]
            buf = srcs1[3 + 11]
            assert srcs2[3 + 9] is out[0] and srcs2[3 + 10] is out[1] and srcs2[3 + 11] is buf
            assert buf.numel() * 4 == c.plan.nbytes
            names = ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens")
            assert all(s is mine[n] for s, n in zip(srcs1[3:12], names))
            for notes, srcs, lst in ((notes1, srcs1, c.lists[0]), (notes2, srcs2, c.lists[1])):
                assert len(notes) == len(lst.specs) > 0
                for note, spec in zip(notes, lst.specs):
                    assert list(note["params"]) == _expected_params(spec, srcs[3:], buf)
                    assert note["grid"] == spec.grid
            if rank == 0:
                calls, last = dict(multi_gpu._CALLS), multi_gpu._LAST
                with fastcall.serving_stub(False):
                    multi_gpu._CALLS.clear()
                    multi_gpu._LAST = None   # (a first call: the normal path)
                    ref = multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
                multi_gpu._CALLS.clear()
                multi_gpu._CALLS.update(calls)
                multi_gpu._LAST = last
                assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    finally:
        dist.destroy_process_group()


def test_rank_plans_decline_what_the_signature_sees(fake_rank0, serving_stub):
    """Other bounds (values or types), another group, checked values, another option or
    tensor: not the plans' (the Python path takes the call; bad bounds still raise)."""
    fastcall = serving_stub
    x = make_prefill_inputs([100, 150], GDNShape(1, 2, 16), seed=0, device=DEV)
    mine = {n: (t[:128] if n in ("q", "k", "v", "a", "b") else t) for n, t in x.items()}
    multi_gpu.prefill_multi_gpu(**mine, bounds=[0, 128, 250], check_values=False)
    f = multi_gpu._LAST
    args = tuple(mine[n] for n in ("q", "k", "v", "state", "A_log", "a", "dt_bias", "b",
                                   "cu_seqlens"))

    def served(bounds=(0, 128, 250), group=None, check_values=False, scale=None, a=args):
        return multi_gpu._run_fast(f, *a, scale, list(bounds), group, 2, 0, check_values,
                                   None) is not None

    assert served()
    assert not served(bounds=(0, 120, 250))
    assert not served(bounds=(0, 128.0, 250))
    assert not served(group=object())
    assert not served(check_values=None)
    assert not served(scale=0.5)
    assert not served(a=(args[0][:64],) + args[1:])
    assert not served(a=args[:3] + (None,) + args[4:])
    assert multi_gpu._run_fast(f, *args, None, [0, 128, 250], None, 2, 1, False, None) is None
    with pytest.raises(ValueError, match="bounds"):
        multi_gpu.prefill_multi_gpu(**mine, bounds=[0, 128.0, 250], check_values=False)
    (c,) = multi_gpu._CALLS.values()
    multi_gpu.prefill_multi_gpu(**mine, bounds=[0, 128, 250], check_values=None)  # checked
    assert len(multi_gpu._CALLS) == 2
    assert [x.fast is None for x in multi_gpu._CALLS.values()] == [False, True]


@pytest.fixture
def unrecordable_phase_c(monkeypatch):
    """Phase C marks its bind not recordable, as the Gluon walk does on sm_90 (its launch
    builds TMA descriptors from the addresses per call)."""
    from kernels import launch

    real = multi_gpu.phase_c_fwd

    def gluon_like(*a, **k):
        launch.not_recordable()
        return real(*a, **k)
    monkeypatch.setattr(multi_gpu, "phase_c_fwd", gluon_like)


@pytest.mark.parametrize("stub", [False, True])
def test_a_half_not_recordable_is_bound_per_call(fake_rank0, unrecordable_phase_c, stub):
    """Where the half after the exchange cannot be recorded (the Gluon walk), the half before
    it still is (and, with the fastcall stub serving, is the first plan; no second plan):
    repeats with other tensors give the normal path's bits, the second half bound per
    call."""
    from kernels import fastcall

    if stub and (not interpret.INTERPRET or fastcall._compiler() is None
                 or fastcall.load() is None):
        pytest.skip("the stub's plans (CPU, a C++ compiler)")
    bounds = [0, 128, 250]
    multi_gpu._CALLS.clear()
    multi_gpu._LAST = None
    with (fastcall.serving_stub() if stub else nullcontext()):
        for seed in range(3):
            x = make_prefill_inputs([100, 150], GDNShape(1, 2, 16), seed=seed, device=DEV)
            mine = {n: (t[:128] if n in ("q", "k", "v", "a", "b") else t)
                    for n, t in x.items()}
            out = multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
            (c,) = multi_gpu._CALLS.values()
            assert c.lists is not None and c.lists[0] is not None and c.lists[1] is None
            if stub:
                assert c.fast is not None and c.fast.plan2 is None
                assert multi_gpu._LAST is c.fast
            calls, last = dict(multi_gpu._CALLS), multi_gpu._LAST
            multi_gpu._CALLS.clear()
            multi_gpu._LAST = None
            with fastcall.serving_stub(False):
                ref = multi_gpu.prefill_multi_gpu(**mine, bounds=bounds, check_values=False)
            multi_gpu._CALLS.clear()
            multi_gpu._CALLS.update(calls)
            multi_gpu._LAST = last
            assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    multi_gpu._CALLS.clear()
    multi_gpu._LAST = None
