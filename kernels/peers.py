"""FLA, FlashInfer, FlashQLA and torch behind one calling convention (docs/design.md, "Peers").

Every implementation returned here is called like ours::

    decode:  fn(q, k, v, state, A_log, a, dt_bias, b, scale=None) -> (output, new_state)
    prefill: fn(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None)
             -> (output, new_state)

with the shapes of :mod:`kernels.spec` (decode ``output [B,1,HV,D] bf16``,
prefill ``output [T,HV,D] bf16``, ``new_state [., HV, D, D] f32`` k-last) and
the input ``state`` left untouched - except ``flashinfer_inplace``, see below.
Whatever an adapter does beyond the library call (gate math, a state copy,
output allocation, reshapes) is part of that peer's measured cost.

Decode peers
------------
``fla``         ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule`` with
                the gates computed in its kernel (``use_gate_in_kernel``,
                ``use_beta_sigmoid_in_kernel``) and ``state_v_first=True`` (k-last);
                one launch; returns a new state.
``flashinfer``  ``flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose`` with
                ``use_qk_l2norm=False`` (its default, True, computes another
                function). It updates the state *in place*, so the adapter first
                copies it: the copy (``B*HV*D*D*4`` bytes read and written, a
                device-to-device memcpy before the kernel) is part of this peer's
                time.
``flashinfer_inplace``  the same call on the caller's ``state`` itself: the kernel
                alone, but the input state is overwritten (it violates the
                convention; use it for timing and Nsight Compute, gate with
                ``flashinfer``).
``flashinfer_bf16_inplace``  the same ``gated_delta_rule_decode_pretranspose`` on a
                *bf16* state (FlashInfer's bf16-state kernel: state read and written
                in bf16; versions that have it also take ``T > 1`` tokens there),
                updated in place like ``flashinfer_inplace``; refuses an f32 state.
``flashinfer_mtp_inplace``  ``flashinfer.gdn_decode.gated_delta_rule_mtp`` (multi-token
                decode, ``[B, T, ...]`` inputs) on an f32 state used as a pool of ``B``
                slots (indices ``0..B-1``, made once per batch size and device),
                ``disable_state_update=False``, no intermediate states; updates the
                state in place.
``torch``       :func:`kernels.reference.decode_reference` (eager float32 PyTorch).

The ``*_inplace`` peers break the convention on purpose (the kernel alone is
timed); callers gate and time them on their own copy of the state.

Prefill peers
-------------
``fla``         ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` on a batch of one
                packed sequence set, FLA's own Triton kernels: the call runs with
                ``FLA_FLASH_QLA=0`` (FLA dispatches to FlashQLA on Hopper when that
                is importable; this row never does). The adapter computes ``g =
                -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` (f32
                ``[T,HV]``) as PyTorch ops, and returns ``output[0]``. Label
                ``"fla (triton)"``.
``fla_recurrent`` ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule`` on the
                packed sequences (``cu_seqlens``): FLA's token-recurrent kernel (one
                launch, gates in the kernel as for the decode peer, ``state_v_first``),
                its answer to short prompts. Label ``"fla (fused recurrent)"``. Like
                FLA's decode it also runs under the Triton interpreter.
``fla_flashqla`` the same FLA call with ``FLA_FLASH_QLA=1``: FLA's backend dispatch
                hands it to FlashQLA (checked on each call with FLA's own verifier;
                a rejected call raises instead of silently running Triton). Label
                ``"fla (flashqla backend)"``.
``flashqla``    ``flash_qla.chunk_gated_delta_rule`` (Qwen's TileLang prefill, SM90+,
                automatic intra-card context parallelism), gates as for ``fla``,
                ``state_v_first=True``: FlashQLA reads and writes our k-last
                ``[N, HV, V, K]`` state as is, so no layout conversion is needed.
``flashinfer``  ``flashinfer.gdn_prefill.chunk_gated_delta_rule`` (SM90+), with the
                linear decay ``alpha = exp(g)`` and post-sigmoid ``beta`` computed
                by the adapter, preallocated ``output``/``output_state``.
``torch``       :func:`kernels.reference.prefill_reference`.

``flashqla`` and ``fla_flashqla`` need tilelang, whose ``apache-tvm-ffi`` pin conflicts
with FlashInfer's: the notebooks run them (:data:`WORKER_PEERS`) in a worker process with
their own site folder (:mod:`kernels.peers_worker`, ``GDN_QLA_SITE``); the builders here
are what that worker calls.

On a CPU host with ``TRITON_INTERPRET=1``, FLA's *decode* runs under the
Triton interpreter and is reported available (about 2 s per call at B=1,
growing linearly with B: fine for smoke tests, useless for timing); FLA's
chunked prefill does not run there and is unavailable.

Availability never raises: :func:`peer_impls` (:func:`decode_impls` /
:func:`prefill_impls`) returns an :class:`Unavailable` (falsy, with ``.reason``) for a
peer that cannot run here - not installed, no GPU, wrong architecture, import error.

:data:`PEERS` is the one table of peers (name, op, builder, label, package, worker):
adding a peer is its builder and a row there; the notebooks take them through
:mod:`kernels.registry`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Union

import torch
import torch.nn.functional as F

from .reference import decode_reference, prefill_reference
from .spec import resolve_scale

__all__ = ["Unavailable", "Peer", "PEERS", "DECODE_PEERS", "PREFILL_PEERS", "WORKER_PEERS",
           "decode_impls", "prefill_impls", "peer_impls", "peer_status", "peer_version",
           "prefill_gates", "prefill_label", "default_peers", "peer_columns"]


class Unavailable:
    """A peer that cannot run here. Falsy; calling it raises ``RuntimeError``."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason

    def __bool__(self) -> bool:
        return False

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.name} is unavailable: {self.reason}")

    def __repr__(self) -> str:
        return f"Unavailable({self.name!r}, {self.reason!r})"


PeerFn = Union[Callable, Unavailable]


class _Missing(Exception):
    """Internal: why a peer cannot be built."""


# --------------------------------------------------------------------------- checks


def _need_package(module: str, dist: str) -> None:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as e:
        raise _Missing(f"{dist} is not importable: {e}") from e
    if not found:
        raise _Missing(f"{dist} is not installed (no module {module!r})")


def _need_cuda(what: str, min_cc=None) -> None:
    if not torch.cuda.is_available():
        raise _Missing(f"{what} needs a CUDA GPU; torch sees none")
    if min_cc is not None:
        cc = torch.cuda.get_device_capability()
        if tuple(cc) < tuple(min_cc):
            raise _Missing(f"{what} needs compute capability >= {min_cc[0]}.{min_cc[1]}, "
                           f"this GPU is sm_{cc[0]}{cc[1]}")


def _import(module: str, name: str, dist: str):
    try:
        mod = importlib.import_module(module)
        return getattr(mod, name)
    except Exception as e:  # ImportError, or anything a package raises at import
        raise _Missing(f"cannot import {module}.{name} from {dist}: "
                       f"{type(e).__name__}: {e}") from e


def _need_params(fn, names: Iterable[str], what: str) -> None:
    """Fail when ``fn``'s signature lacks keyword ``names`` (an old version; a
    ``**kwargs`` catch-all could swallow them silently). A signature hidden by
    a bare ``(*args, **kwargs)`` wrapper is not checked."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    named = [p for p in params.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not named:
        return
    missing = [n for n in names if n not in params]
    if missing:
        raise _Missing(f"{what} lacks parameter(s) {', '.join(missing)} (version too old?)")


# --------------------------------------------------------------------------- gates


def prefill_gates(A_log, a, dt_bias, b):
    """Log decay ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``.

    Args: A_log, dt_bias `[HV]` f32; a, b `[T,HV]` bf16. Returns two `[T,HV]` f32 tensors.
    """
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)


def _i64(cu: torch.Tensor) -> torch.Tensor:
    return cu if cu.dtype == torch.int64 else cu.to(torch.int64)


# --------------------------------------------------------------------------- FLA


def _fla_fused_recurrent() -> Callable:
    """FLA's ``fused_recurrent_gated_delta_rule`` (decode and the recurrent prefill peer)."""
    _need_package("fla", "fla-core")
    if not torch.cuda.is_available():
        from . import interpret

        if not interpret.INTERPRET:
            raise _Missing("FLA (Triton kernels) needs a CUDA GPU, or TRITON_INTERPRET=1 "
                           "(where its recurrent kernel runs, slowly); torch sees no GPU")
        interpret.install()  # CPU: FLA's recurrent kernel runs under the Triton interpreter
    fused = _import("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule", "fla-core")
    _need_params(fused, ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "state_v_first",
                         "cu_seqlens"), "fla fused_recurrent_gated_delta_rule")
    return fused


def _fla_decode() -> Callable:
    fused = _fla_fused_recurrent()

    def fla_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        """FLA fused recurrent decode, gates in kernel. Shapes: see :mod:`kernels.spec`."""
        o, ht = fused(q, k, v, g=a, beta=b, scale=resolve_scale(scale, q.shape[-1]),
                      initial_state=state, output_final_state=True, use_gate_in_kernel=True,
                      A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                      state_v_first=True)
        return _bf16(o), ht

    return fla_decode


def _fla_recurrent_prefill() -> Callable:
    fused = _fla_fused_recurrent()

    def fla_recurrent_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
        """FLA fused recurrent over packed sequences, gates in kernel. `[T,...]` packed."""
        o, ht = fused(q[None], k[None], v[None], g=a[None], beta=b[None],
                      scale=resolve_scale(scale, q.shape[-1]), initial_state=state,
                      output_final_state=True, use_gate_in_kernel=True, A_log=A_log,
                      dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True,
                      cu_seqlens=_i64(cu_seqlens))
        return _bf16(o[0]), ht

    return fla_recurrent_prefill


#: FLA's switch of its FlashQLA backend (``fla/ops/gated_delta_rule/backends/flash_qla.py``,
#: ``env_var``; read by FLA on every call).
FLA_FLASH_QLA = "FLA_FLASH_QLA"


@contextlib.contextmanager
def _env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _fla_prefill(flashqla: bool = False) -> Callable:
    _need_package("fla", "fla-core")
    _need_cuda("FLA chunked prefill (Triton; does not run under the Triton interpreter)")
    chunk = _import("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", "fla-core")
    _need_params(chunk, ("state_v_first", "cu_seqlens"), "fla chunk_gated_delta_rule")
    switch = "1" if flashqla else "0"
    backend = None
    if flashqla:
        _need_cuda("FlashQLA (TileLang)", min_cc=(9, 0))
        _need_package("flash_qla", "flash-qla")
        backend = _import("fla.ops.gated_delta_rule.backends.flash_qla", "FlashQLABackend",
                          "fla-core (a version with the FlashQLA backend)")()
        if getattr(importlib.import_module("fla.backends"), "_DISPATCH_DISABLED", False):
            raise _Missing("FLA's backend dispatch is off (FLA_DISABLE_BACKEND_DISPATCH=1)")

    def fla_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
        """FLA chunked prefill; gates computed here as PyTorch ops. `[T,...]` packed."""
        g, beta = prefill_gates(A_log, a, dt_bias, b)
        args = (q[None], k[None], v[None], g[None], beta[None])
        kw = dict(scale=resolve_scale(scale, q.shape[-1]), initial_state=state,
                  output_final_state=True, state_v_first=True, cu_seqlens=_i64(cu_seqlens))
        with _env(FLA_FLASH_QLA, switch):
            if backend is not None:
                ok, why = backend.verify("chunk_gated_delta_rule", *args, **kw)
                if not (ok and backend.is_available() and backend.is_enabled()):
                    raise RuntimeError(f"FLA would not dispatch this call to FlashQLA: {why}")
            o, ht = chunk(*args, **kw)
        return _bf16(o[0]), ht

    fla_prefill.__name__ = "fla_flashqla_prefill" if flashqla else "fla_prefill"
    return fla_prefill


# --------------------------------------------------------------------------- FlashQLA


def _flashqla_prefill() -> Callable:
    # flash_qla reads the device's properties at import: check for the GPU first
    _need_cuda("FlashQLA (TileLang)", min_cc=(9, 0))
    _need_package("flash_qla", "flash-qla")
    chunk = _import("flash_qla", "chunk_gated_delta_rule", "flash-qla")
    _need_params(chunk, ("state_v_first", "cu_seqlens", "initial_state"),
                 "flash_qla.chunk_gated_delta_rule")

    def flashqla_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
        """FlashQLA chunked prefill (auto intra-card CP); state k-last via ``state_v_first``."""
        g, beta = prefill_gates(A_log, a, dt_bias, b)
        o, ht = chunk(q[None], k[None], v[None], g=g[None], beta=beta[None],
                      scale=resolve_scale(scale, q.shape[-1]), initial_state=state,
                      output_final_state=True, cu_seqlens=_i64(cu_seqlens), state_v_first=True)
        return _bf16(o[0]), ht

    return flashqla_prefill


# --------------------------------------------------------------------------- FlashInfer


def _flashinfer_decode(copy_state: bool) -> Callable:
    _need_package("flashinfer", "flashinfer-python")
    _need_cuda("FlashInfer GDN decode (CuTe-DSL)", min_cc=(8, 0))
    kernel = _import("flashinfer.gdn_decode", "gated_delta_rule_decode_pretranspose",
                     "flashinfer-python")
    _need_params(kernel, ("use_qk_l2norm", "output"), "flashinfer gated_delta_rule_decode_pretranspose")

    def flashinfer_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        """FlashInfer pretranspose decode on a copy of ``state`` (the copy is timed)."""
        st = state.clone() if copy_state else state
        out = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
        o, new = kernel(q, k, v, st, A_log, a, dt_bias, b,
                        scale=resolve_scale(scale, q.shape[-1]), output=out, use_qk_l2norm=False)
        return _bf16(o if o is not None else out), (new if new is not None else st)

    flashinfer_decode.__name__ = "flashinfer_decode" if copy_state else "flashinfer_decode_inplace"
    return flashinfer_decode


def _flashinfer_bf16_decode() -> Callable:
    _need_package("flashinfer", "flashinfer-python")
    _need_cuda("FlashInfer GDN bf16-state decode (CuTe-DSL)", min_cc=(9, 0))
    kernel = _import("flashinfer.gdn_decode", "gated_delta_rule_decode_pretranspose",
                     "flashinfer-python")
    _need_params(kernel, ("use_qk_l2norm", "output"),
                 "flashinfer gated_delta_rule_decode_pretranspose")

    def flashinfer_decode_bf16_inplace(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        """FlashInfer pretranspose decode on a bf16 state, updated in place."""
        if state.dtype != torch.bfloat16:
            raise TypeError(f"flashinfer_bf16_inplace needs a bf16 state, got {state.dtype}")
        out = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
        o, new = kernel(q, k, v, state, A_log, a, dt_bias, b,
                        scale=resolve_scale(scale, q.shape[-1]), output=out, use_qk_l2norm=False)
        return _bf16(o if o is not None else out), (new if new is not None else state)

    return flashinfer_decode_bf16_inplace


def _flashinfer_mtp_decode() -> Callable:
    _need_package("flashinfer", "flashinfer-python")
    _need_cuda("FlashInfer GDN MTP decode (CuTe-DSL)", min_cc=(9, 0))
    kernel = _import("flashinfer.gdn_decode", "gated_delta_rule_mtp", "flashinfer-python")
    _need_params(kernel, ("intermediate_states_buffer", "disable_state_update", "use_qk_l2norm",
                          "output"), "flashinfer gated_delta_rule_mtp")
    slots: Dict[tuple, torch.Tensor] = {}

    def flashinfer_mtp_inplace(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        """FlashInfer MTP decode of ``T`` tokens; ``state`` is a pool of ``B`` slots,
        updated in place."""
        B = q.shape[0]
        key = (B, state.device)
        if key not in slots:
            slots[key] = torch.arange(B, dtype=torch.int32, device=state.device)
        out = torch.empty(v.shape, dtype=torch.bfloat16, device=v.device)
        o, new = kernel(q, k, v, state, slots[key], A_log, a, dt_bias, b,
                        scale=resolve_scale(scale, q.shape[-1]), output=out,
                        intermediate_states_buffer=None, disable_state_update=False,
                        use_qk_l2norm=False)
        return _bf16(o if o is not None else out), (new if new is not None else state)

    return flashinfer_mtp_inplace


def _flashinfer_prefill() -> Callable:
    _need_package("flashinfer", "flashinfer-python")
    _need_cuda("FlashInfer GDN prefill", min_cc=(9, 0))
    chunk = _import("flashinfer.gdn_prefill", "chunk_gated_delta_rule", "flashinfer-python")
    _need_params(chunk, ("output", "output_state", "cu_seqlens"),
                 "flashinfer gdn_prefill.chunk_gated_delta_rule")

    def flashinfer_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
        """FlashInfer chunked prefill with linear decay ``alpha = exp(g)``."""
        g, beta = prefill_gates(A_log, a, dt_bias, b)
        T, HV, D = v.shape
        N = cu_seqlens.numel() - 1
        out = torch.empty(T, HV, D, dtype=torch.bfloat16, device=v.device)
        out_state = torch.empty(N, HV, D, D, dtype=torch.float32, device=v.device)
        res = chunk(q, k, v, g=torch.exp(g), beta=beta, scale=resolve_scale(scale, D),
                    initial_state=state, output_final_state=True, cu_seqlens=_i64(cu_seqlens),
                    output=out, output_state=out_state)
        if isinstance(res, tuple) and len(res) == 2:
            return _bf16(res[0]), res[1]
        return out, out_state

    return flashinfer_prefill


# --------------------------------------------------------------------------- torch


def _torch_decode() -> Callable:
    def torch_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None):
        """Eager float32 PyTorch (the reference)."""
        return decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale)

    return torch_decode


def _torch_prefill() -> Callable:
    def torch_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
        """Eager float32 PyTorch (the reference)."""
        return prefill_reference(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)

    return torch_prefill


@dataclass(frozen=True)
class Peer:
    """One peer: its ``name`` in ``impls`` lists, ``op``, ``build`` (returns the callable,
    raises :class:`_Missing` with the reason it cannot run here), ``label`` in tables and
    legends, the ``package`` (module) whose version :func:`peer_version` reports, and
    whether the notebooks run it in :mod:`kernels.peers_worker` (``worker``: prefill peers,
    which that worker serves). ``default_in``: the notebooks (their numbers, as their stems
    begin) whose default ``impls`` run it (:func:`default_peers`). ``column``: its column in
    the results page's tables of its op (:mod:`kernels.report`, :func:`peer_columns`; ""
    for none)."""

    name: str
    op: str
    build: Callable[[], Callable]
    label: str
    package: str
    worker: bool = False
    default_in: tuple = ()
    column: str = ""


_FLA, _FLASHINFER, _FLASH_QLA, _TORCH = "fla", "flashinfer", "flash_qla", "torch"

#: Every peer: adding one is a builder above and a row here (docs/architecture.md).
PEERS = (
    Peer("fla", "decode", _fla_decode, "fla", _FLA, default_in=("01", "03"), column="FLA"),
    Peer("flashinfer", "decode", lambda: _flashinfer_decode(copy_state=True), "flashinfer",
         _FLASHINFER, default_in=("01", "03"), column="FlashInfer"),
    Peer("flashinfer_inplace", "decode", lambda: _flashinfer_decode(copy_state=False),
         "flashinfer_inplace", _FLASHINFER),
    Peer("flashinfer_bf16_inplace", "decode", _flashinfer_bf16_decode,
         "flashinfer_bf16_inplace", _FLASHINFER),
    Peer("flashinfer_mtp_inplace", "decode", _flashinfer_mtp_decode, "flashinfer_mtp_inplace",
         _FLASHINFER),
    Peer("torch", "decode", _torch_decode, "torch", _TORCH, default_in=("01",)),
    Peer("fla", "prefill", _fla_prefill, "fla (triton)", _FLA, default_in=("02", "04"),
         column="FLA (triton)"),
    Peer("fla_recurrent", "prefill", _fla_recurrent_prefill, "fla (fused recurrent)", _FLA,
         default_in=("02",)),
    Peer("fla_flashqla", "prefill", lambda: _fla_prefill(flashqla=True),
         "fla (flashqla backend)", _FLASH_QLA, worker=True, default_in=("02", "04"),
         column="FLA (FlashQLA backend)"),
    Peer("flashqla", "prefill", _flashqla_prefill, "flashqla", _FLASH_QLA, worker=True,
         default_in=("02", "04"), column="FlashQLA"),
    Peer("flashinfer", "prefill", _flashinfer_prefill, "flashinfer", _FLASHINFER,
         default_in=("02", "04"), column="FlashInfer"),
    Peer("torch", "prefill", _torch_prefill, "torch", _TORCH),
)
DECODE_PEERS = tuple(p.name for p in PEERS if p.op == "decode")
PREFILL_PEERS = tuple(p.name for p in PEERS if p.op == "prefill")
#: Prefill peers the notebooks run in :mod:`kernels.peers_worker` (tilelang's own site).
WORKER_PEERS = tuple(p.name for p in PEERS if p.worker)


def _peer(op: str, name: str):
    """The row of :data:`PEERS` of ``op`` peer ``name`` (None if unknown)."""
    return next((p for p in PEERS if p.op == op and p.name == name), None)


def default_peers(op: str, notebook: str) -> list:
    """The ``op`` peers that notebook ``notebook`` (its stem, ``02_prefill_launch_overhead``,
    or its number) runs by default, in :data:`PEERS`' order (its ``impls`` parameter's
    default, after ours)."""
    number = notebook.split("_")[0]
    return [p.name for p in PEERS if p.op == op and number in p.default_in]


def peer_columns(op: str) -> Dict[str, tuple]:
    """``{column: (label, name)}`` of the ``op`` peers with a column in the results page's
    tables (:mod:`kernels.report`), in :data:`PEERS`' order: a column takes the rows
    labelled with the peer's label or, as older runs labelled them, its name."""
    return {p.column: (p.label, p.name) for p in PEERS if p.op == op and p.column}


def prefill_label(name: str) -> str:
    """The label of prefill peer ``name`` in tables and legends (the name if unknown)."""
    peer = _peer("prefill", name)
    return peer.label if peer else name


def peer_impls(op: str, names: Iterable[str]) -> Dict[str, PeerFn]:
    """``{name: callable or Unavailable}`` for the ``op`` peers ``names`` (never raises)."""
    if isinstance(names, str):
        names = (names,)
    out: Dict[str, PeerFn] = {}
    for name in names:
        peer = _peer(op, name)
        if peer is None:
            known = ", ".join(p.name for p in PEERS if p.op == op)
            out[name] = Unavailable(name, f"unknown {op} peer {name!r}; known: {known}")
            continue
        try:
            out[name] = peer.build()
        except _Missing as e:
            out[name] = Unavailable(name, str(e))
        except Exception as e:  # a peer must never take the caller down
            out[name] = Unavailable(name, f"{type(e).__name__}: {e}")
    return out


def decode_impls(names: Iterable[str] = ("fla", "flashinfer", "torch")) -> Dict[str, PeerFn]:
    """``{name: callable or Unavailable}`` for decode peers (see the module docstring)."""
    return peer_impls("decode", names)


def prefill_impls(names: Iterable[str] = ("fla", "flashinfer", "torch")) -> Dict[str, PeerFn]:
    """``{name: callable or Unavailable}`` for prefill peers (see the module docstring)."""
    return peer_impls("prefill", names)


def peer_version(name: str, op: str = "prefill") -> str:
    """The installed version of the package behind peer ``name`` (or why there is none)."""
    from .packages import package_version

    peer = _peer(op, name)
    return "" if peer is None else package_version(peer.package)


def peer_status():
    """One row per (op, peer): ``impl, op, available, reason, version``."""
    import pandas as pd

    rows = []
    for op in ("decode", "prefill"):
        for name, fn in peer_impls(op, [p.name for p in PEERS if p.op == op]).items():
            rows.append(dict(impl=name, op=op, available=bool(fn),
                             reason="" if fn else fn.reason, version=peer_version(name, op)))
    return pd.DataFrame(rows, columns=["impl", "op", "available", "reason", "version"])
