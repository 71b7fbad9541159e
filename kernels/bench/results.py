"""Write a notebook's results so a failed run never clobbers the last good ones.

Layout (docs/design.md, "The results contract"): ``<root>/<gpu-slug>/<notebook>/`` holds the CSVs, PNGs
and ``provenance.json`` of the last *completed* run of ``<notebook>``.

:class:`ResultWriter` writes into a temporary sibling folder
``<root>/<slug>/.tmp-<notebook>-<pid>`` and, on a clean exit, swaps it in:
the old folder is renamed aside, the new one renamed into place, the old one
deleted (renames within one folder: atomic on POSIX, so a reader sees the old
or the new results, never a half-written mix). On an exception the temporary
folder becomes ``<root>/<slug>/failed-<notebook>`` (for post-mortems; the
previous ``failed-`` folder is replaced) or is deleted (``keep_failed=False``);
the last good results are untouched.

Use it as a context manager, or across notebook cells with
``open()`` ... ``commit()`` (``abort()`` on failure).

A run killed outright (SIGKILL, power loss) cannot clean up: it leaves its
``.tmp-*`` folder behind, and if it died between the two renames of ``commit``
the last good results sit in ``.old-<notebook>-<pid>``. :func:`sweep_leftovers`
(called by :mod:`kernels.runner` once it holds the output root's lock, so no
other run is writing) deletes the former and renames the latter back.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Dict, Optional, Union

import pandas as pd

from ..device import gpu_slug, slugify

__all__ = ["ResultWriter", "load_results", "load_provenance", "sweep_leftovers"]

_OLD = re.compile(r"^\.old-(?P<notebook>.+)-\d+$")


def sweep_leftovers(parent: Union[str, Path]) -> list:
    """Clean what killed runs left in ``<root>/<slug>`` (call only while no other run
    writes there): ``.tmp-*`` folders are deleted; an ``.old-<notebook>-<pid>`` folder is
    renamed back to ``<notebook>`` when that is missing (the kill fell between the two
    renames of a commit), else deleted. Returns one line per action."""
    parent = Path(parent)
    done = []
    if not parent.is_dir():
        return done
    for p in sorted(parent.iterdir()):
        m = _OLD.match(p.name)
        if p.name.startswith(".tmp-"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
            done.append(f"removed leftover {p}")
        elif m and p.is_dir():
            final = parent / m.group("notebook")
            if final.exists():
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed leftover {p}")
            else:
                os.rename(p, final)
                done.append(f"restored last good results {final} from {p}")
    return done


def _json_default(obj):
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def _finite(obj):
    """Replace NaN/inf floats (invalid JSON) by None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class ResultWriter:
    """Collect one notebook's outputs in a temporary folder; move it into place on success.

    Args:
        notebook: the notebook's stem, e.g. ``"01_decode_crossover"``.
        root: results root (``results``).
        gpu: device name or slug; None -> :func:`kernels.device.gpu_slug` of this host.
        keep_failed: on failure keep the temporary folder as ``failed-<notebook>``.
    Attributes:
        dir: the temporary folder to write into (set by ``open``/``__enter__``).
        final_dir: ``<root>/<slug>/<notebook>``.
    """

    def __init__(self, notebook: str, root: Union[str, Path] = "results",
                 gpu: Optional[str] = None, keep_failed: bool = True):
        if not notebook or "/" in notebook or notebook.startswith("."):
            raise ValueError(f"notebook must be a plain folder name, got {notebook!r}")
        self.notebook = notebook
        self.slug = gpu_slug() if gpu is None else slugify(gpu)
        self.parent = Path(root) / self.slug
        self.final_dir = self.parent / notebook
        self.keep_failed = keep_failed
        self.dir: Optional[Path] = None
        self.committed: Optional[Path] = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> "ResultWriter":
        """Create a fresh temporary folder; returns self."""
        self.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.parent / f".tmp-{self.notebook}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        self.dir = tmp
        return self

    def commit(self) -> Path:
        """Replace ``final_dir`` by the temporary folder; returns ``final_dir``."""
        tmp = self._need_dir()
        old = self.parent / f".old-{self.notebook}-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        had_old = self.final_dir.exists()
        if had_old:
            os.rename(self.final_dir, old)
        try:
            os.rename(tmp, self.final_dir)
        except OSError:
            if had_old:  # put the last good results back
                os.rename(old, self.final_dir)
            raise
        if had_old:
            shutil.rmtree(old, ignore_errors=True)
        self.dir = None
        self.committed = self.final_dir
        return self.final_dir

    def abort(self) -> Optional[Path]:
        """Discard the temporary folder (kept as ``failed-<notebook>`` when
        ``keep_failed``); returns where it went, if kept."""
        if self.dir is None or not self.dir.exists():
            self.dir = None
            return None
        tmp, self.dir = self.dir, None
        if not self.keep_failed:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        failed = self.parent / f"failed-{self.notebook}"
        if failed.exists():
            shutil.rmtree(failed)
        os.rename(tmp, failed)
        return failed

    def __enter__(self) -> "ResultWriter":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False

    # ------------------------------------------------------------------ writing
    def _need_dir(self) -> Path:
        if self.dir is None:
            raise RuntimeError("ResultWriter is not open: use `with ResultWriter(...)` or .open()")
        return self.dir

    def path(self, name: str) -> Path:
        """``dir / name`` (for files an instrument writes itself)."""
        return self._need_dir() / name

    def write_csv(self, df: pd.DataFrame, name: str) -> Path:
        """``df`` as ``<name>.csv`` (no index)."""
        p = self.path(name if name.endswith(".csv") else name + ".csv")
        df.to_csv(p, index=False)
        return p

    def save_fig(self, fig, name: str, dpi: int = 150) -> Path:
        """A matplotlib figure as ``<name>.png``: an opaque figure in a palette of 256
        colours without dithering (a third of the RGB file's bytes for these line, bar and
        heat-map plots, the same to the eye: results/README.md gives the sizes), one with
        transparency as matplotlib writes it."""
        import io

        from PIL import Image

        p = self.path(name if name.endswith(".png") else name + ".png")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
        with Image.open(buf) as im:
            if im.mode == "RGBA" and im.getextrema()[3][0] < 255:
                p.write_bytes(buf.getvalue())
            else:
                im.convert("RGB").quantize(256, dither=Image.Dither.NONE).save(
                    p, format="PNG", optimize=True, dpi=(dpi, dpi))
        return p

    def write_json(self, obj, name: str) -> Path:
        """``obj`` as indented ``<name>.json`` (NaN -> null, numpy scalars -> numbers)."""
        p = self.path(name if name.endswith(".json") else name + ".json")
        p.write_text(json.dumps(_finite(obj), indent=2, default=_json_default) + "\n")
        return p

    def write_provenance(self, params: Optional[dict] = None, **extra) -> Path:
        """:func:`kernels.bench.provenance.collect_provenance` as ``provenance.json``."""
        from .provenance import collect_provenance

        rec = collect_provenance(params)
        rec.update(extra)
        return self.write_json(rec, "provenance.json")


def load_results(path: Union[str, Path]) -> Dict[str, pd.DataFrame]:
    """Every CSV of a result folder as ``{stem: DataFrame}`` (sorted by name)."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"no result folder at {p}")
    return {f.stem: pd.read_csv(f) for f in sorted(p.glob("*.csv"))}


def load_provenance(path: Union[str, Path]) -> dict:
    """``provenance.json`` of a result folder (or the file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / "provenance.json"
    return json.loads(p.read_text())
