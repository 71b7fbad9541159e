"""compute-sanitizer over our kernels, one small case per process, as a check to rerun.

    python -m kernels.bench.sanitize list
    python -m kernels.bench.sanitize run CASE            # one case once on the GPU
    python -m kernels.bench.sanitize check --out DIR [--tools memcheck,racecheck,synccheck]
                                           [--cases A,B] [--timeout S] [--sanitizer PATH]

``check`` runs ``compute-sanitizer --tool T ... python -m kernels.bench.sanitize run CASE``
for every (tool, case) as a subprocess (a timeout each, progress on stderr), keeps each raw
log as ``DIR/<tool>__<case>.log`` and writes ``DIR/sanitize.csv``: one row per (tool, case)
with ``kernel = "*"`` (the run: exit status, seconds, the tool's summary counts) and one row
per kernel a record names (its errors, racecheck reports and hazards, hazard kinds, up to
three sample locations). The exit status is 0 iff every run ended with a summary.

Cases (:data:`CASES`): decode; the prefill paths ``recurrent``, ``single``, ``walk``,
``cp`` (chained CP) and ``cp_long`` with the Triton phase C (``gluon_walk=False``), each at
the smallest lengths that select it on an H100 / H200 (132 SMs, sm_90: the runner checks
the plan and refuses a case whose rules moved); the Gluon phase C
(:mod:`kernels.prefill.state_walk_gluon`, from 16,384 tokens per sequence on sm_90) at a
full-chunk and a partial-chunk length, with the device split, and at the issue's two
lengths ``[40000]`` and ``[20000, 23333]`` with the contest heads. The other prefill cases
take one q/k head and two value heads (racecheck is slow; the paths do not depend on it).

Control kernels (``ctrl_*``, :func:`ctrl_kernel`): one CTA, a 4-warp default partition and
a 4-warp worker, written to tell the tool's model of warp specialization from real
hazards:

* ``ctrl_tutorial``: the default partition stores a tile to shared memory, fences, arrives
  on an mbarrier; the worker waits, loads it, stores it out (as Gluon tutorials write it);
* ``ctrl_thread_barrier``: the same with a partition-local thread barrier before the arrive
  (``mbarrier.arrive`` releases only the executing thread's accesses; Triton arrives from
  one thread). On triton 3.6 and 3.7.1 the lowering of ``mbarrier.arrive`` already puts a
  ``bar.sync <partition barrier>, 128`` before the one-thread arrive
  (:func:`arrive_has_partition_barrier` checks the PTX), so this variant should read as
  ``ctrl_tutorial``;
* ``ctrl_no_wait``: the worker does not wait: a true race, racecheck must report it (the
  control that the tool sees hazards in warp-specialized code at all);
* ``ctrl_args_only``: no shared memory of ours, only the partitions' arguments (Triton
  passes them, and each worker warp's partition index, through shared memory written by
  every thread of the default partition before a CTA-wide ``barrier.sync 1``): any
  hazard here is the warp-specialize lowering's;
* ``ctrl_prologue_reduce``: ``ctrl_tutorial`` after a reduction in the default warps
  before ``warp_specialize`` (its scratch is shared memory that the later buffers may
  reuse), as the Gluon walk's guard does.

Documentation, the hand-overs of the Gluon walk and what to expect:
docs/notes/instruments.md, "Memory safety: compute-sanitizer".
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import threading
from concurrent.futures import ThreadPoolExecutor
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Case", "CASES", "CONTROL_MODES", "TOOLS", "build_command", "parse_log",
           "summarize", "run_case", "check", "main", "ctrl_kernel",
           "arrive_has_partition_barrier"]

#: The tools ``check`` runs by default (initcheck also works: ``--tools initcheck``).
TOOLS = ("memcheck", "racecheck", "synccheck")

#: Printed by ``run`` when its case has finished on the device (the driver looks for it).
DONE = "SANITIZE_CASE_DONE"


@dataclass(frozen=True)
class Case:
    """One run: ``kind`` is ``decode``, ``prefill`` or ``control``."""

    name: str
    kind: str
    lens: Tuple[int, ...] = ()      # prefill: sequence lengths
    heads: Tuple[int, int] = (1, 2)  # prefill / decode: (HQ, HV); D = 128
    batch: int = 0                  # decode
    path: str = ""                  # prefill: the plan's path it must take (sm_90, 132 SMs)
    gluon: Optional[bool] = None    # prefill on a long path: the Gluon phase C or not
    mode: str = ""                  # control: one of CONTROL_MODES
    note: str = ""


CONTEST_HEADS = (4, 8)

#: Control kernel variants (constexpr ``MODE`` of :func:`ctrl_kernel`).
CONTROL_MODES = OrderedDict([
    ("tutorial", 0), ("thread_barrier", 1), ("no_wait", 2), ("args_only", 3),
    ("prologue_reduce", 4)])

_CASES = [
    Case("decode", "decode", batch=4, heads=CONTEST_HEADS, note="gdn_decode, contest heads"),
    Case("recurrent", "prefill", (6,), path="recurrent"),
    Case("single", "prefill", (100, 28), path="single"),
    Case("walk", "prefill", (300, 212), path="walk"),
    Case("cp", "prefill", (4100,), path="cp", note="chained CP, partial last chunk"),
    Case("cp_long_triton", "prefill", (16400,), path="cp_long", gluon=False,
         note="long path, Triton phase C (gluon_walk=False)"),
    Case("gluon_full", "prefill", (16384,), path="cp_long", gluon=True,
         note="Gluon phase C, whole chunks only"),
    Case("gluon_partial", "prefill", (16400,), path="cp_long", gluon=True,
         note="Gluon phase C, a partial last chunk (the k-row zeroing, kfix)"),
    Case("gluon_split", "prefill", (49152,), path="cp_long_split", gluon=True,
         note="Gluon phase C with the device split"),
    Case("gluon_issue_40000", "prefill", (40000,), heads=CONTEST_HEADS, path="cp_long",
         gluon=True, note="the issue's length, contest heads"),
    Case("gluon_issue_20000_23333", "prefill", (20000, 23333), heads=CONTEST_HEADS,
         path="cp_long", gluon=True, note="the issue's lengths, contest heads"),
] + [Case(f"ctrl_{m}", "control", mode=m) for m in CONTROL_MODES]

CASES: "OrderedDict[str, Case]" = OrderedDict((c.name, c) for c in _CASES)


# --------------------------------------------------------------------------- control kernels

from .. import interpret  # noqa: E402

interpret.install()

try:   # the Gluon API of triton 3.6 and 3.7 (the GPU host's and the CPU's)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier
    HAVE_GLUON = True
except ImportError:   # pragma: no cover
    HAVE_GLUON = False

#: Tile side of the control kernels (a [CTRL_N, CTRL_N] f32 tile, 4 KB).
CTRL_N = 32

if HAVE_GLUON:
    # a CTA-level thread barrier (inside a partition: the partition's named barrier):
    # ``gl.thread_barrier`` in triton 3.6, ``gl.barrier`` in 3.7
    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

    @gluon.jit
    def _ctrl_tile(N: gl.constexpr):
        L: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        r = gl.arange(0, N, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, N, layout=gl.SliceLayout(0, L))
        return r[:, None] * N + c[None, :]

    @gluon.jit
    def _ctrl_default(x_ptr, y_ptr, buf, bar, bias, MODE: gl.constexpr, N: gl.constexpr):
        """Default partition (4 warps): ``y = 2 x + bias`` into ``buf``, handed over."""
        off = _ctrl_tile(N)
        x = gl.load(x_ptr + off)
        if MODE == 3:   # args_only: no shared memory, its own output
            gl.store(y_ptr + off, x * 2.0 + bias)
        else:
            buf.store(x * 2.0 + bias)
            fence_async_shared()
            if MODE == 1:
                _thread_barrier()
            mbarrier.arrive(bar)

    @gluon.jit
    def _ctrl_worker(x_ptr, y_ptr, buf, bar, bias, MODE: gl.constexpr, N: gl.constexpr):
        """Worker (4 warps): waits for the tile (not in ``no_wait``) and stores it to ``y``."""
        off = _ctrl_tile(N)
        L: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
        if MODE == 3:   # args_only: the second half of the output from x and the argument
            gl.store(y_ptr + N * N + off, gl.load(x_ptr + off) - bias)
        else:
            if MODE != 2:
                mbarrier.wait(bar, 0)
            gl.store(y_ptr + off, buf.load(L))

    @gluon.jit
    def ctrl_kernel(x_ptr, y_ptr, MODE: gl.constexpr, N: gl.constexpr):
        """One CTA: the hand-over of :data:`CONTROL_MODES` ``MODE`` (the module doc)."""
        bias = 1.0
        if MODE == 3:   # args_only: a value computed at run time, a capture to pass
            bias = gl.load(x_ptr) * 0.0 + 1.0
        if MODE == 4:   # prologue_reduce: a reduction (shared scratch) before the region
            R: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            v = gl.load(x_ptr + gl.arange(0, 128, layout=R))
            bias = gl.max(v, axis=0) * 0.0 + 1.0
        SL: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        buf = gl.allocate_shared_memory(gl.float32, [N, N], SL)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        gl.warp_specialize([
            (_ctrl_default, (x_ptr, y_ptr, buf, bar, bias, MODE, N)),
            (_ctrl_worker, (x_ptr, y_ptr, buf, bar, bias, MODE, N)),
        ], [4], [128])


def _control(case: Case):
    import torch

    N = CTRL_N
    x = torch.arange(N * N, dtype=torch.float32, device="cuda") / 7.0
    y = torch.zeros(2 * N * N, dtype=torch.float32, device="cuda")
    ctrl_kernel[(1,)](x, y, MODE=CONTROL_MODES[case.mode], N=N, num_warps=4)
    torch.cuda.synchronize()
    want = x * 2.0 + 1.0
    if case.mode == "no_wait":   # a race: any value may be read, nothing to check
        return
    if case.mode == "args_only":
        want = torch.cat([want, x - 1.0])
        got = y
    else:
        got = y[:N * N]
    if not torch.equal(got, want):
        raise AssertionError(f"{case.name}: wrong output (max diff "
                             f"{(got - want).abs().max().item()})")


def arrive_has_partition_barrier(ptx: str) -> List[bool]:
    """For each ``mbarrier.arrive`` without ``expect_tx`` in ``ptx``: whether the
    instruction before it (skipping comments, labels, address arithmetic) is a
    ``bar.sync``/``barrier.sync`` (the lowering orders every thread of the partition before
    the one-thread arrive)."""
    out, last = [], None
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".loc", "$L__")) or s.endswith(":"):
            continue
        if "mbarrier.arrive" in s and "expect_tx" not in s:
            out.append(last is not None and re.match(r"(bar|barrier)\.sync\b", last) is not None)
        if not re.match(r"(add|mov|cvt|shl|or|and|setp)\.", s):
            last = s
    return out


# --------------------------------------------------------------------------- the cases


def _prefill_config(case: Case):
    from kernels.prefill import PrefillConfig

    return PrefillConfig(gluon_walk=False) if case.gluon is False else None


def case_plan(case: Case, device="cuda"):
    """The plan the dispatch makes for ``case`` on ``device`` (a prefill case)."""
    import torch

    from kernels.prefill import plan as plan_mod

    HQ, HV = case.heads
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    return plan_mod.call_plan(sum(case.lens), len(case.lens), HV, 128, dev, None,
                              _prefill_config(case))


def _check_plan(case: Case, plan) -> None:
    got = (plan.path, bool(plan.phase_c_gluon) if case.gluon is not None else None)
    want = (case.path, case.gluon)
    if got != want:
        raise RuntimeError(f"case {case.name}: the dispatch plans (path, gluon) = {got}, "
                           f"the case is written for {want}: update the case's lengths")


def run_case(name: str) -> None:
    """Run case ``name`` once on the current CUDA device and wait for it."""
    import torch

    from kernels.spec import GDNShape, make_decode_inputs, make_prefill_inputs

    case = CASES[name]
    if not torch.cuda.is_available():
        raise RuntimeError("the sanitizer cases run on a CUDA GPU")
    if case.kind == "control":
        if not HAVE_GLUON:
            raise RuntimeError("this Triton has no Gluon")
        _control(case)
    elif case.kind == "decode":
        from kernels.decode import gdn_decode

        x = make_decode_inputs(case.batch, GDNShape(*case.heads, 128), device="cuda")
        gdn_decode(x["q"], x["k"], x["v"], x["state"], x["A_log"], x["a"], x["dt_bias"],
                   x["b"], x["scale"])
    else:
        from kernels.prefill import gdn_prefill

        _check_plan(case, case_plan(case))
        x = make_prefill_inputs(list(case.lens), GDNShape(*case.heads, 128), device="cuda")
        out = gdn_prefill(**x, config=_prefill_config(case))
        torch.cuda.synchronize()
        if not all(bool(torch.isfinite(t.float()).all()) for t in out):
            raise AssertionError(f"{name}: non-finite outputs")
    torch.cuda.synchronize()
    print(f"{DONE} {name}", flush=True)


# --------------------------------------------------------------------------- the driver


def find_sanitizer(explicit: Optional[str] = None) -> Optional[str]:
    """``explicit``, ``$COMPUTE_SANITIZER``, ``compute-sanitizer`` on ``PATH``, or the
    newest ``/usr/local/cuda*/bin/compute-sanitizer``."""
    if explicit:
        return explicit
    if os.environ.get("COMPUTE_SANITIZER"):
        return os.environ["COMPUTE_SANITIZER"]
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    cands = sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"))
    return str(cands[-1]) if cands else None


def build_command(tool: str, case: str, sanitizer: str = "compute-sanitizer",
                  python: Optional[str] = None, print_limit: int = 10000,
                  extra: Sequence[str] = ()) -> List[str]:
    """The command line of one (tool, case) run. racecheck reports both forms
    (``--racecheck-report all``: a record per hazardous byte with its kind and block, and
    the analysis lines "Race reported between ... [N hazards]")."""
    if tool not in TOOLS + ("initcheck",):
        raise ValueError(f"unknown tool {tool!r}")
    if case not in CASES:
        raise ValueError(f"unknown case {case!r} (known: {', '.join(CASES)})")
    cmd = [sanitizer, "--tool", tool, "--print-limit", str(int(print_limit))]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
    cmd += list(extra)
    cmd += [python or sys.executable, "-m", "kernels.bench.sanitize", "run", case]
    return cmd


_PREFIX = re.compile(r"^=+\s?")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) errors?")
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY:\s*(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_HAZARD = re.compile(r"Potential (RAW|WAR|WAW) hazard detected at __shared__ (0x[0-9a-fA-F]+)"
                     r"(?: in block \(([^)]*)\))?")
_THREAD = re.compile(r"^\s*(Read|Write) Thread \(([^)]*)\) at (.*?)\s*$")
_RACE1 = re.compile(r"Race reported between (Read|Write) access at (.*?)\s*$")
_RACE2 = re.compile(r"^\s*and (Read|Write) access at (.*?)(?:\s*\[(\d+) hazards?\])?\s*$")
_AT = re.compile(r"^\s*at (.*?)\s*$")
_ERR_HEAD = re.compile(r"^(?:Error|ERROR|Warning|WARN)?[^:]*:?\s*"
                       r"(Invalid __\w+__ \w+|Barrier error|Misaligned|Uninitialized|"
                       r"Out-of-range|Malloc/Free|Program hit|Leaked|Cuda API error)")
_KINDS = {("Write", "Read"): "RAW", ("Read", "Write"): "WAR", ("Write", "Write"): "WAW",
          ("Read", "Read"): "RAR"}


def _where(text: str) -> Tuple[str, str]:
    """``(kernel, location)`` of "kern(args)+0x1a0 in file.py:12" (or the older
    "0x1a0 in file.py:12:kern(args)")."""
    text = text.strip()
    loc = ""
    m = re.match(r"(.*?) in (\S+:\d+)$", text)
    if m:
        text, loc = m.group(1), m.group(2)
    m = re.match(r"0x[0-9a-fA-F]+ in (\S+?:\d+):(.+)$", text)
    if m:
        return m.group(2).strip(), m.group(1)
    m = re.match(r"(.+?)\+(0x[0-9a-fA-F]+)$", text)
    if m:
        return m.group(1).strip(), loc or "+" + m.group(2)
    return text, loc


def _short(kernel: str) -> str:
    return kernel.split("(")[0].strip() or kernel


@dataclass
class KernelStats:
    errors: int = 0
    reports: int = 0
    hazards: int = 0
    kinds: Counter = field(default_factory=Counter)
    samples: List[str] = field(default_factory=list)

    def sample(self, s: str) -> None:
        if s not in self.samples and len(self.samples) < 3:
            self.samples.append(s)


def parse_log(text: str) -> dict:
    """compute-sanitizer's output → ``{"errors", "race": (displayed, errors, warnings) or
    None, "kernels": {kernel: KernelStats}, "done": bool}``. Per kernel: racecheck's
    analysis records ("Race reported between ...": one report, its ``[N hazards]``) when
    present, else its per-byte hazard records; the kind of an analysis record is its two
    accesses' (write then read: RAW). Other tools' error records count as ``errors``."""
    lines = [_PREFIX.sub("", ln.rstrip("\n")) for ln in text.splitlines()]
    kernels: Dict[str, KernelStats] = {}
    byte_kinds: Dict[str, Counter] = {}
    byte_counts: Counter = Counter()
    analysed = set()
    out = dict(errors=None, race=None, done=DONE in text, kernels=kernels)
    i = 0
    while i < len(lines):
        ln = lines[i]
        m = _ERROR_SUMMARY.search(ln)
        if m:
            out["errors"] = int(m.group(1))
        m = _RACE_SUMMARY.search(ln)
        if m:
            out["race"] = tuple(int(g) for g in m.groups())
        m = _HAZARD.search(ln)
        if m:
            kind = m.group(1)
            acc = []
            for j in (i + 1, i + 2):
                t = _THREAD.match(lines[j]) if j < len(lines) else None
                if t:
                    acc.append((t.group(1), *_where(t.group(3))))
            if acc:
                k = _short(acc[0][1])
                byte_counts[k] += 1
                byte_kinds.setdefault(k, Counter())[kind] += 1
                st = kernels.setdefault(k, KernelStats())
                st.sample(f"{kind} " + " -> ".join(f"{a[0]} {a[2]}" for a in acc))
            i += 1
            continue
        m = _RACE1.search(ln)
        if m and i + 1 < len(lines):
            m2 = _RACE2.match(lines[i + 1])
            if m2:
                k1, loc1 = _where(m.group(2))
                _, loc2 = _where(m2.group(2))
                k = _short(k1)
                kind = _KINDS[(m.group(1), m2.group(1))]
                st = kernels.setdefault(k, KernelStats())
                st.reports += 1
                st.hazards += int(m2.group(3) or 1)
                st.kinds[kind] += int(m2.group(3) or 1)
                st.sample(f"{kind} {m.group(1)} {loc1} -> {m2.group(1)} {loc2}")
                analysed.add(k)
                i += 2
                continue
        if _ERR_HEAD.search(ln) and "SUMMARY" not in ln:
            for j in range(i + 1, min(i + 4, len(lines))):
                a = _AT.match(lines[j])
                if a:
                    k, loc = _where(a.group(1))
                    st = kernels.setdefault(_short(k), KernelStats())
                    st.errors += 1
                    st.sample(f"{ln.strip()[:80]} at {loc}")
                    break
        i += 1
    for k, n in byte_counts.items():   # hazard records only where no analysis record
        if k not in analysed:
            st = kernels[k]
            st.hazards += n
            st.reports += n
            st.kinds.update(byte_kinds[k])
    return out


CSV_FIELDS = ["tool", "case", "kernel", "status", "rc", "seconds", "errors", "reports",
              "hazards", "hazard_kinds", "samples", "log"]


def summarize(tool: str, case: str, text: str, rc, seconds: float, log: str) -> List[dict]:
    """The CSV rows of one run (:data:`CSV_FIELDS`)."""
    p = parse_log(text)
    has_summary = p["errors"] is not None or p["race"] is not None
    if rc == "timeout":
        status = "timeout"
    elif not has_summary:
        status = "no_summary"
    elif not p["done"]:
        status = "case_failed"
    else:
        status = "ok"
    race = p["race"]
    rows = [dict(tool=tool, case=case, kernel="*", status=status, rc=rc,
                 seconds=round(seconds, 1),
                 errors=(race[1] if race else p["errors"]) if has_summary else "",
                 reports=race[0] if race else "",
                 hazards=sum(s.hazards for s in p["kernels"].values()) if race else "",
                 hazard_kinds="", samples="", log=log)]
    for k, st in sorted(p["kernels"].items()):
        rows.append(dict(tool=tool, case=case, kernel=k, status=status, rc=rc, seconds="",
                         errors=st.errors, reports=st.reports, hazards=st.hazards,
                         hazard_kinds=";".join(f"{a}:{n}" for a, n in sorted(st.kinds.items())),
                         samples=" | ".join(st.samples), log=log))
    return rows


def check(out: Path, tools: Iterable[str] = TOOLS, cases: Iterable[str] = tuple(CASES),
          timeout: float = 1800, sanitizer: Optional[str] = None,
          extra: Sequence[str] = (), progress=print, jobs_at_once: int = 1) -> List[dict]:
    """Run every (tool, case), ``jobs_at_once`` processes at a time (each is one small
    launch; racecheck's cost is on the host); write the raw logs, ``sanitize.csv`` and
    ``provenance.json`` (GPU, versions, commit, these arguments) under ``out``."""
    from .provenance import collect_provenance

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tool_bin = find_sanitizer(sanitizer)
    if tool_bin is None:
        raise SystemExit("compute-sanitizer not found: pass --sanitizer or set COMPUTE_SANITIZER")
    (out / "provenance.json").write_text(json.dumps(collect_provenance(dict(
        tools=list(tools), cases=list(cases), timeout=timeout, sanitizer=tool_bin,
        extra=list(extra), jobs=jobs_at_once)), indent=1) + "\n")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.setdefault("TRITON_INTERPRET", "0")
    rows: List[dict] = []
    jobs = [(t, c) for t in tools for c in cases]
    lock = threading.Lock()

    def one(n: int, tool: str, case: str) -> None:
        cmd = build_command(tool, case, tool_bin, extra=extra)
        log = out / f"{tool}__{case}.log"
        progress(f"[{n}/{len(jobs)}] {tool} {case} ...")
        t0 = time.perf_counter()
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                    cwd=root, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        dt = time.perf_counter() - t0
        new = summarize(tool, case, log.read_text(errors="replace"), rc, dt, log.name)
        head = new[0]
        with lock:
            rows.extend(new)
            progress(f"    {tool} {case}: {head['status']} in {dt:.0f} s: errors "
                     f"{head['errors']}, reports {head['reports']}, hazards {head['hazards']}"
                     + "".join(f"\n      {r['kernel']}: hazards {r['hazards']} "
                               f"({r['hazard_kinds']}), errors {r['errors']}"
                               for r in new[1:]))
            order = {j: i for i, j in enumerate(jobs)}
            rows.sort(key=lambda r: order[(r["tool"], r["case"])])   # stable: kernels stay
            with open(out / "sanitize.csv", "w", newline="") as f:   # rewritten after each run
                w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
                w.writeheader()
                w.writerows(rows)

    with ThreadPoolExecutor(max_workers=max(1, int(jobs_at_once))) as pool:
        for fut in [pool.submit(one, n, t, c) for n, (t, c) in enumerate(jobs, 1)]:
            fut.result()
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.bench.sanitize",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the cases")
    r = sub.add_parser("run", help="run one case once on the GPU")
    r.add_argument("case", choices=list(CASES))
    c = sub.add_parser("check", help="compute-sanitizer over (tool, case)")
    c.add_argument("--out", required=True)
    c.add_argument("--tools", default=",".join(TOOLS))
    c.add_argument("--cases", default=",".join(CASES))
    c.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    c.add_argument("--sanitizer", help="compute-sanitizer binary")
    c.add_argument("--extra", default="", help="more compute-sanitizer options (one string)")
    c.add_argument("--jobs", type=int, default=1, help="runs at a time")
    a = ap.parse_args(argv)
    if a.cmd == "list":
        for case in CASES.values():
            what = case.mode if case.kind == "control" else (
                f"{list(case.lens)} heads {case.heads} -> {case.path}"
                + ("" if case.gluon is None else f" gluon={case.gluon}")
                if case.kind == "prefill" else f"B={case.batch} heads {case.heads}")
            print(f"{case.name:<26} {case.kind:<8} {what}  {case.note}")
        return 0
    if a.cmd == "run":
        run_case(a.case)
        return 0
    tools = [t for t in a.tools.split(",") if t]
    cases = [x for x in a.cases.split(",") if x]
    bad = [x for x in cases if x not in CASES]
    if bad:
        ap.error(f"unknown cases {bad} (known: {', '.join(CASES)})")
    rows = check(Path(a.out), tools, cases, a.timeout, a.sanitizer, a.extra.split(),
                 progress=lambda s: print(s, file=sys.stderr, flush=True), jobs_at_once=a.jobs)
    return 0 if all(r["status"] == "ok" for r in rows if r["kernel"] == "*") else 1


if __name__ == "__main__":
    sys.exit(main())
