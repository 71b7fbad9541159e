"""flashinfer-bench definitions and workloads built from :mod:`kernels.spec`.

Plain dicts in the flashinfer-bench trace format (``Definition``, workload
``Trace``), so building and testing them needs neither flashinfer-bench nor a
GPU; :mod:`kernels.contest.evaluate` validates them with flashinfer-bench's own
models before a run.

- The names are the contest's public definitions,
  ``gdn_decode_qk4_v8_d128_k_last`` and ``gdn_prefill_qk4_v8_d128_k_last`` for
  :data:`kernels.spec.CONTEST` (same axes, input/output names and order).
- Inputs are in the order of our calling convention (the parameters of
  :func:`kernels.reference.decode_reference` / ``prefill_reference``), dtypes
  are those :func:`kernels.spec.make_decode_inputs` / ``make_prefill_inputs``
  produce; the symbolic shapes below are checked against both by the tests.
- The reference is our float32 reference (:mod:`kernels.spec` +
  :mod:`kernels.reference` flattened into one file) with a ``run`` function.
- Workloads: decode at :data:`kernels.spec.DECODE_BATCH_SIZES`, prefill at the
  sequence-length lists of :data:`kernels.spec.PREFILL_SHAPES` (6 to 8,192
  tokens, 1 to 57 sequences). Every tensor input is a safetensors blob written
  from our seeded realistic inputs (flashinfer-bench's random inputs would be
  un-normalised keys and a unit-variance state, on which the recurrence is
  not a meaningful test, and a random ``cu_seqlens``); ``scale`` is a scalar.
"""
from __future__ import annotations

import inspect
import uuid
from typing import Dict, List, Optional

from ..spec import CONTEST, DECODE_BATCH_SIZES, PREFILL_SHAPES, GDNShape, resolve_scale
from .bundle import flatten_modules

__all__ = ["OPS", "definition_name", "decode_definition", "prefill_definition", "definition",
           "reference_source", "input_shapes", "output_shapes", "workloads", "workload_inputs",
           "blob_path", "OP_TYPE"]

OPS = ("decode", "prefill")
OP_TYPE = "gdn"
_UUID_NS = uuid.UUID("6c1c7a52-5f0e-4d55-9d0a-1f6a8f3b7c21")

# symbolic shapes of our calling convention (kernels/spec.py docstring); None: a scalar
_DECODE_INPUTS = {
    "q": ["batch_size", "seq_len", "num_q_heads", "head_size"],
    "k": ["batch_size", "seq_len", "num_k_heads", "head_size"],
    "v": ["batch_size", "seq_len", "num_v_heads", "head_size"],
    "state": ["batch_size", "num_v_heads", "head_size", "head_size"],
    "A_log": ["num_v_heads"],
    "a": ["batch_size", "seq_len", "num_v_heads"],
    "dt_bias": ["num_v_heads"],
    "b": ["batch_size", "seq_len", "num_v_heads"],
    "scale": None,
}
_DECODE_OUTPUTS = {
    "output": (["batch_size", "seq_len", "num_v_heads", "head_size"], "bfloat16"),
    "new_state": (["batch_size", "num_v_heads", "head_size", "head_size"], "float32"),
}
_PREFILL_INPUTS = {
    "q": ["total_seq_len", "num_q_heads", "head_size"],
    "k": ["total_seq_len", "num_k_heads", "head_size"],
    "v": ["total_seq_len", "num_v_heads", "head_size"],
    "state": ["num_seqs", "num_v_heads", "head_size", "head_size"],
    "A_log": ["num_v_heads"],
    "a": ["total_seq_len", "num_v_heads"],
    "dt_bias": ["num_v_heads"],
    "b": ["total_seq_len", "num_v_heads"],
    "cu_seqlens": ["len_cu_seqlens"],
    "scale": None,
}
_PREFILL_OUTPUTS = {
    "output": (["total_seq_len", "num_v_heads", "head_size"], "bfloat16"),
    "new_state": (["num_seqs", "num_v_heads", "head_size", "head_size"], "float32"),
}
_DESCRIPTIONS = {
    "state": "Recurrent state, k-last: element (k, v) of head h at state[..., h, v, k].",
    "A_log": "Log decay parameter: decay = exp(-exp(A_log) * softplus(a + dt_bias)).",
    "a": "Raw decay gate input.",
    "dt_bias": "Decay bias, added to a before softplus.",
    "b": "Raw update gate input: beta = sigmoid(b).",
    "cu_seqlens": "Cumulative sequence lengths of the packed sequences (starts at 0, ends at T).",
    "scale": "Output scale; 0 means 1/sqrt(head_size).",
}


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")


def definition_name(op: str, shape: GDNShape = CONTEST) -> str:
    """``gdn_<op>_qk<HQ>_v<HV>_d<D>_k_last`` (the contest's names for :data:`CONTEST`)."""
    _check_op(op)
    return f"gdn_{op}_qk{shape.num_q_heads}_v{shape.num_v_heads}_d{shape.head_dim}_k_last"


def _reference_fn(op: str):
    from .. import reference

    return reference.decode_reference if op == "decode" else reference.prefill_reference


def _input_dtypes(op: str, shape: GDNShape) -> Dict[str, str]:
    """dtype names of our generated inputs (``"float32"`` for the scalar ``scale``)."""
    from .. import spec

    inputs = (spec.make_decode_inputs(1, shape) if op == "decode"
              else spec.make_prefill_inputs([2], shape))
    out = {}
    for name, value in inputs.items():
        out[name] = "float32" if value is None or not hasattr(value, "dtype") \
            else str(value.dtype).replace("torch.", "")
    return out


def _reference_params(op: str) -> List[str]:
    """The reference's parameters up to the first one with a default after ``scale`` (the
    serving extras of the decode reference, ``state_indices`` and ``intermediate_states``,
    are not the contest's)."""
    sig = inspect.signature(_reference_fn(op)).parameters
    names = list(sig)
    cut = names.index("scale") + 1 if "scale" in names else len(names)
    if any(sig[n].default is inspect.Parameter.empty for n in names[cut:]):
        raise AssertionError(f"reference parameters after scale need defaults: {names[cut:]}")
    return names[:cut]


def reference_source(op: str) -> str:
    """Our float32 reference as one self-contained file with ``run(<inputs>)``."""
    _check_op(op)
    fn = _reference_fn(op)
    params = _reference_params(op)
    body = flatten_modules(["kernels.spec", "kernels.reference"])
    return (body + "\n\n@torch.no_grad()\n"
            f"def run({', '.join(params)}):\n"
            f'    """flashinfer-bench entry: :func:`{fn.__name__}` -> (output, new_state)."""\n'
            f"    return {fn.__name__}({', '.join(params)})\n")


def definition(op: str, shape: GDNShape = CONTEST) -> dict:
    """The flashinfer-bench ``Definition`` of ``op`` (a JSON-ready dict)."""
    _check_op(op)
    sym_in, sym_out = ((_DECODE_INPUTS, _DECODE_OUTPUTS) if op == "decode"
                       else (_PREFILL_INPUTS, _PREFILL_OUTPUTS))
    params = _reference_params(op)
    if params != list(sym_in):
        raise AssertionError(f"reference parameters {params} differ from the symbolic "
                             f"inputs {list(sym_in)}")
    dtypes = _input_dtypes(op, shape)
    const = {"num_q_heads": shape.num_q_heads, "num_k_heads": shape.num_q_heads,
             "num_v_heads": shape.num_v_heads, "head_size": shape.head_dim}
    if op == "decode":
        axes = {"batch_size": {"type": "var", "description": "Sequences decoded at once."},
                "seq_len": {"type": "const", "value": 1,
                            "description": "One token per sequence."}}
        constraints = []
        stage = "stage:decode"
    else:
        axes = {"total_seq_len": {"type": "var", "description": "Tokens of all sequences (T)."},
                "num_seqs": {"type": "var", "description": "Packed sequences (N)."},
                "len_cu_seqlens": {"type": "var", "description": "num_seqs + 1."}}
        constraints = ["len_cu_seqlens == num_seqs + 1",
                       "total_seq_len == cu_seqlens[-1].item()"]
        stage = "stage:prefill"
    axes.update({n: {"type": "const", "value": v} for n, v in const.items()})
    inputs = {}
    for name, sym in sym_in.items():
        inputs[name] = {"shape": sym, "dtype": dtypes[name]}
        if name in _DESCRIPTIONS:
            inputs[name]["description"] = _DESCRIPTIONS[name]
    outputs = {name: {"shape": sym, "dtype": dt} for name, (sym, dt) in sym_out.items()}
    return {
        "name": definition_name(op, shape),
        "op_type": OP_TYPE,
        "description": (f"Gated DeltaNet {op}, GVA (HQ={shape.num_q_heads}, "
                        f"HV={shape.num_v_heads}, D={shape.head_dim}), k-last fp32 state. "
                        "Built from kernels/spec.py; reference: kernels/reference.py."),
        "tags": [stage, "model:qwen3-next", "layout:k-last", "source:gdn-kernel-suite"],
        "axes": axes,
        "constraints": ["num_v_heads % num_q_heads == 0", "num_k_heads == num_q_heads",
                        *constraints],
        "inputs": inputs,
        "outputs": outputs,
        "reference": reference_source(op),
    }


def decode_definition(shape: GDNShape = CONTEST) -> dict:
    """:func:`definition` of ``"decode"``."""
    return definition("decode", shape)


def prefill_definition(shape: GDNShape = CONTEST) -> dict:
    """:func:`definition` of ``"prefill"``."""
    return definition("prefill", shape)


def _shapes(defn: dict, axes: Dict[str, int], tensors: dict) -> Dict[str, Optional[tuple]]:
    values = {n: a["value"] for n, a in defn["axes"].items() if a["type"] == "const"}
    values.update(axes)
    return {name: (None if spec["shape"] is None else tuple(values[s] for s in spec["shape"]))
            for name, spec in tensors.items()}


def input_shapes(defn: dict, axes: Dict[str, int]) -> Dict[str, Optional[tuple]]:
    """Concrete input shapes of ``defn`` for variable-axis values ``axes``."""
    return _shapes(defn, axes, defn["inputs"])


def output_shapes(defn: dict, axes: Dict[str, int]) -> Dict[str, Optional[tuple]]:
    """Concrete output shapes of ``defn`` for variable-axis values ``axes``."""
    return _shapes(defn, axes, defn["outputs"])


def blob_path(def_name: str, workload_uuid: str) -> str:
    """Where a workload's tensors live, relative to the trace-set root."""
    return f"blob/workloads/{OP_TYPE}/{def_name}/{workload_uuid}.safetensors"


def workloads(op: str, shape: GDNShape = CONTEST, *, seed: int = 0,
              batch_sizes=DECODE_BATCH_SIZES, prefill_shapes: Optional[Dict] = None
              ) -> List[dict]:
    """The workloads of ``op``: dicts ``{"key", "lens" | "B", "seed", "trace"}``.

    ``key`` matches our result CSVs (decode: ``B``; prefill: the lens label of
    ``PREFILL_SHAPES``, e.g. ``"57x64"``); ``trace`` is the flashinfer-bench workload
    trace (``{"definition", "workload": {"axes", "inputs", "uuid"}}``), its tensor
    inputs pointing at :func:`blob_path`.
    """
    _check_op(op)
    defn_name = definition_name(op, shape)
    tensor_inputs = [n for n, s in (_DECODE_INPUTS if op == "decode" else _PREFILL_INPUTS).items()
                     if s is not None]
    scale = resolve_scale(None, shape.head_dim)
    out = []
    if op == "decode":
        items = [(str(int(B)), {"batch_size": int(B)}, {"B": int(B)}) for B in batch_sizes]
    else:
        shapes = PREFILL_SHAPES if prefill_shapes is None else prefill_shapes
        items = []
        for label, lens in shapes.items():
            lens = [int(n) for n in lens]
            items.append((label, {"total_seq_len": sum(lens), "num_seqs": len(lens),
                                  "len_cu_seqlens": len(lens) + 1}, {"lens": lens}))
    for key, axes, extra in items:
        wid = str(uuid.uuid5(_UUID_NS, f"{defn_name}:{key}:seed{seed}"))
        inputs = {n: {"type": "safetensors", "path": blob_path(defn_name, wid), "tensor_key": n}
                  for n in tensor_inputs}
        inputs["scale"] = {"type": "scalar", "value": scale}
        out.append(dict(key=key, seed=seed, **extra,
                        trace={"definition": defn_name,
                               "workload": {"axes": axes, "inputs": inputs, "uuid": wid}}))
    return out


def workload_inputs(op: str, wl: dict, shape: GDNShape = CONTEST, device="cpu") -> dict:
    """The tensors of workload ``wl`` (from :func:`workloads`) by input name, generated
    by :func:`kernels.spec.make_decode_inputs` / ``make_prefill_inputs`` with its seed.
    ``scale`` is the workload's scalar."""
    from .. import spec

    _check_op(op)
    if op == "decode":
        inputs = spec.make_decode_inputs(wl["B"], shape, seed=wl["seed"], device=device)
    else:
        inputs = spec.make_prefill_inputs(wl["lens"], shape, seed=wl["seed"], device=device)
    inputs["scale"] = wl["trace"]["workload"]["inputs"]["scale"]["value"]
    return inputs
