"""The ``graph`` variant: the ``fused`` prefill captured in a CUDA graph per shape bucket.

Bucket rule (the cache key)::

    (device, T_pad, N_pad, HQ, HV, D, state given, cu_seqlens dtype, scale, cp, config,
     recurrent)
    T_pad = max(64, next power of two >= T)       N_pad = next power of two >= N

``recurrent``: :func:`.config.recurrent_rule` of the call's own ``T`` (a bucket holds
either the token-recurrent kernel or the chunked path, never both). The bucket runs the
plan :func:`.plan.prefill_plan` makes with ``graph=True`` (the bucket's shape,
:func:`.plan.bucket_of`, and that recurrent choice).

A call copies its inputs into the bucket's static buffers with **one** pack
kernel, replays the graph (one launch; inside it the 2 or 4 kernels of
``fused`` planned for ``T_pad``/``N_pad``) and copies the outputs out with
**one** unpack kernel: 3 launches per call whatever the shape. Padding keeps
replays exact: ``cu_seqlens`` is extended with ``N_pad - N`` empty sequences
ending at ``T`` (so it stays non-decreasing), and the token rows ``T ..
T_pad-1`` belong to no sequence -- the kernels' programs for them exit early
and their (stale) contents are never read; padded sequences' states are
computed from stale rows of the state buffer and dropped.

Memory held per bucket (see :func:`graph_cache_info`): the static inputs and
outputs at ``T_pad``/``N_pad`` plus the graph's private pool holding the
intermediates of ``fused`` (one allocation, :func:`.plan.workspace_layout`: ``Tb`` and ``Aqk``,
``gc`` per token and head, and the scratch of a ``"blocks"`` solve (the default
``"batched"`` solve needs none); with CP the segment summaries
``[S, HV, D, 2D]`` f32, and on the long path the entering states ``[S, HV, D, D]``). At T_pad = 8192, N_pad = 1 and the contest shape that is
about 79 MB with the defaults (static buffers ~52 MB, intermediates ~26 MB; ~43 MB of
intermediates with the ``"blocks"`` solve). The cache keeps
the ``MAX_BUCKETS`` most recently used buckets (LRU); :func:`clear_graph_cache`
frees them.

Called while the current stream is being captured (e.g. a benchmark that
graphs the whole call), it records pack -> fused -> unpack into that capture
instead of replaying its own graph.

Off CUDA (CPU / Triton interpreter) there is nothing to capture: the same
pack -> padded ``fused`` -> unpack path runs eagerly (see
:data:`FALLBACK_NOTE`), so the bucketing and padding logic is what CPU tests check.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict

from .. import interpret

interpret.install()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .chunk_index import cu_status  # noqa: E402
from .pipeline import begin_call, fused_launches  # noqa: E402
from .plan import bucket_of, call_plan  # noqa: E402

__all__ = ["prefill_graph", "bucket_of", "graph_cache_info", "clear_graph_cache",
           "MAX_BUCKETS", "FALLBACK_NOTE", "pack_kernel", "unpack_kernel"]

MAX_BUCKETS = 16
FALLBACK_NOTE = ("graph variant: no CUDA device, running the padded bucket eagerly "
                 "(pack -> fused -> unpack) without capture")
_CACHE: "OrderedDict[tuple, _Bucket]" = OrderedDict()
_warned = False
PACK_BLOCK = 1024


@triton.jit(do_not_specialize=["n_qk", "n_v", "n_ab", "n_cu", "n_cu_pad", "n_h0", "n_hv", "T"])
def pack_kernel(
    q, k, v, a, b, cu, h0, A_log, dt_bias,            # caller's inputs (h0 may be None)
    qs, ks, vs, as_, bs, cus, h0s, A_logs, dt_biass,  # bucket's static buffers
    n_qk, n_v, n_ab, n_cu, n_cu_pad, n_h0, n_hv,      # elements to copy (n_cu_pad: static cu)
    T,                                     # real token count: value of the padded cu entries
    BLOCK: tl.constexpr,
    HAS_H0: tl.constexpr,
):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n_qk
    tl.store(qs + o, tl.load(q + o, mask=m), mask=m)
    tl.store(ks + o, tl.load(k + o, mask=m), mask=m)
    m = o < n_v
    tl.store(vs + o, tl.load(v + o, mask=m), mask=m)
    m = o < n_ab
    tl.store(as_ + o, tl.load(a + o, mask=m), mask=m)
    tl.store(bs + o, tl.load(b + o, mask=m), mask=m)
    m = o < n_cu_pad
    b_cu = tl.load(cu + o, mask=o < n_cu, other=0)
    b_cu = tl.where(o < n_cu, b_cu, T.to(b_cu.dtype))
    tl.store(cus + o, b_cu, mask=m)
    if HAS_H0:
        m = o < n_h0
        tl.store(h0s + o, tl.load(h0 + o, mask=m), mask=m)
    m = o < n_hv
    tl.store(A_logs + o, tl.load(A_log + o, mask=m), mask=m)
    tl.store(dt_biass + o, tl.load(dt_bias + o, mask=m), mask=m)


@triton.jit(do_not_specialize=["n_o", "n_ht", "T", "N"])
def unpack_kernel(os_, hts, o, ht, n_o, n_ht,
                  cu, status, T, N,  # the guard (see .guard): the caller's cu_seqlens
                  BLOCK: tl.constexpr, HAS_STATUS: tl.constexpr):
    st = cu_status(cu, N, T, 128)   # (128 entries per load; a jit body reads no globals)
    if HAS_STATUS:
        if tl.program_id(0) == 0:
            tl.store(status, st)
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = p < n_o
    b_o = tl.load(os_ + p, mask=m)
    tl.store(o + p, tl.where(st != 0, float("nan"), b_o.to(tl.float32)).to(b_o.dtype), mask=m)
    m = p < n_ht
    tl.store(ht + p, tl.where(st != 0, float("nan"), tl.load(hts + p, mask=m)), mask=m)


class _Bucket:
    """Static buffers (+ the captured graph on CUDA) of one bucket."""

    def __init__(self, key, q, k, v, state, A_log, dt_bias, cu_seqlens, scale, plan):
        dev = q.device
        HQ, D = q.shape[1], q.shape[2]
        HV = v.shape[1]
        T_pad, N_pad = plan.T, plan.N
        self.key, self.T_pad, self.N_pad, self.scale, self.plan = key, T_pad, N_pad, scale, plan
        self.recurrent = plan.path == "recurrent"
        self.q = torch.empty(T_pad, HQ, D, dtype=q.dtype, device=dev)
        self.k = torch.empty_like(self.q)
        self.v = torch.empty(T_pad, HV, D, dtype=v.dtype, device=dev)
        self.a = torch.empty(T_pad, HV, dtype=torch.bfloat16, device=dev)
        self.b = torch.empty_like(self.a)
        self.cu = torch.empty(N_pad + 1, dtype=cu_seqlens.dtype, device=dev)
        self.state = (torch.empty(N_pad, HV, D, D, dtype=torch.float32, device=dev)
                      if state is not None else None)
        # gate parameters are copied in too (they may differ between layers)
        self.A_log = torch.empty_like(A_log)
        self.dt_bias = torch.empty_like(dt_bias)
        self.o = torch.empty(T_pad, HV, D, dtype=torch.bfloat16, device=dev)
        self.ht = torch.empty(N_pad, HV, D, D, dtype=torch.float32, device=dev)
        self.graph = None
        static = sum(t.numel() * t.element_size() for t in self._tensors())
        self.nbytes = static + plan.nbytes   # (plan.nbytes: the workspace, the graph's pool)
        self.seg_chunks = 0 if self.recurrent else plan.seg_chunks

    def _tensors(self):
        ts = [self.q, self.k, self.v, self.a, self.b, self.cu, self.A_log, self.dt_bias,
              self.o, self.ht]
        return ts + ([self.state] if self.state is not None else [])

    def load(self, q, k, v, state, A_log, a, dt_bias, b, cu_seqlens):
        """Pack the call's inputs into the static buffers (one kernel)."""
        T, N = q.shape[0], cu_seqlens.numel() - 1
        n_h0 = state.numel() if state is not None else 0
        n = max(q.numel(), v.numel(), a.numel(), self.N_pad + 1, n_h0, A_log.numel(), 1)
        pack_kernel[(triton.cdiv(n, PACK_BLOCK),)](
            q, k, v, a, b, cu_seqlens, state, A_log, dt_bias,
            self.q, self.k, self.v, self.a, self.b, self.cu, self.state, self.A_log,
            self.dt_bias,
            q.numel(), v.numel(), a.numel(), N + 1, self.N_pad + 1, n_h0, A_log.numel(), T,
            BLOCK=PACK_BLOCK, HAS_H0=state is not None,
        )

    def run(self):
        """The bucket's plan (:class:`.plan.Plan`, the padded fused prefill) on the static
        buffers (what the graph captures); its ``cu_seqlens`` is guarded by :meth:`unload`
        on the caller's tensors."""
        fused_launches(self.plan, self.q, self.k, self.v, self.state, self.A_log, self.a,
                       self.dt_bias, self.b, self.cu, self.scale, self.o, self.ht)

    def capture(self):
        stream = torch.cuda.Stream(device=self.q.device)
        stream.wait_stream(torch.cuda.current_stream(self.q.device))
        with torch.cuda.stream(stream):
            self.run()   # warm-up: compiles the kernels outside the capture
        torch.cuda.current_stream(self.q.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run()
        self.graph = graph

    def unload(self, o, ht, cu_seqlens, status):
        """Copy the outputs out; NaN instead if the caller's ``cu_seqlens`` is invalid (the
        guard of :mod:`.guard`, fused into this kernel), status bits into ``status``."""
        n_o, n_ht = o.numel(), ht.numel()
        n = max(n_o, n_ht, 1)
        unpack_kernel[(triton.cdiv(n, PACK_BLOCK),)](
            self.o, self.ht, o, ht, n_o, n_ht, cu_seqlens, status, o.shape[0],
            cu_seqlens.numel() - 1, BLOCK=PACK_BLOCK, HAS_STATUS=status is not None)


def prefill_graph(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None, *,
                  output=None, output_state=None, check_values=None, cp=None, config=None,
                  status=None):
    """``fused`` through a per-bucket CUDA graph (eager padded bucket off CUDA). The unpack
    kernel checks ``cu_seqlens`` on the device (NaN outputs if invalid, see :mod:`.guard`),
    whether or not the host checked it too."""
    global _warned
    shape, scale_r, o, ht, _ = begin_call(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                                      output, output_state, check_values, status)
    T, N = q.shape[0], cu_seqlens.numel() - 1
    on_cuda = q.device.type == "cuda"
    D = shape.head_dim
    plan = call_plan(T, N, shape.num_v_heads, D, q.device, cp, config, True)
    key = (str(q.device), plan.T, plan.N, shape.num_q_heads, shape.num_v_heads, D,
           state is not None, cu_seqlens.dtype, scale_r, cp, config, plan.path == "recurrent")
    bucket = _CACHE.get(key)
    if bucket is None:
        bucket = _Bucket(key, q, k, v, state, A_log, dt_bias, cu_seqlens, scale_r, plan)
        _CACHE[key] = bucket
        while len(_CACHE) > MAX_BUCKETS:
            _CACHE.popitem(last=False)
    _CACHE.move_to_end(key)
    bucket.load(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens)
    if on_cuda and torch.cuda.is_current_stream_capturing():
        bucket.run()   # inside someone else's capture: let it record the kernels
    elif on_cuda:
        if bucket.graph is None:
            bucket.capture()
        bucket.graph.replay()
    else:
        if not _warned:
            warnings.warn(FALLBACK_NOTE, RuntimeWarning, stacklevel=2)
            _warned = True
        bucket.run()
    bucket.unload(o, ht, cu_seqlens, status)
    return o, ht


def graph_cache_info():
    """One dict per cached bucket: key fields, captured or not, bytes held (estimate)."""
    out = []
    for key, bk in _CACHE.items():
        out.append(dict(device=key[0], T_pad=bk.T_pad, N_pad=bk.N_pad, HQ=key[3], HV=key[4],
                        D=key[5], state=key[6], cu_dtype=str(key[7]), scale=key[8],
                        seg_chunks=bk.seg_chunks, recurrent=bk.recurrent,
                        captured=bk.graph is not None, bytes=bk.nbytes))
    return out


def clear_graph_cache() -> None:
    """Drop every bucket (and its graph and memory pool)."""
    _CACHE.clear()
