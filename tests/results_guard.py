"""What a user's ``make run`` wrote, for the tests that run notebooks to check they left it
alone: they write under their own output root (``--output-root``, or ``GDN_OUTPUT_ROOT`` for
``output_root="auto"``: tests/conftest.py), never into the repository's ``results/smoke/``."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "results" / "smoke"


def smoke_results_state(folder: Path = SMOKE) -> dict:
    """``{relative path: (size, mtime_ns)}`` of every file under ``folder`` (the
    repository's ``results/smoke/``); empty where it does not exist."""
    if not folder.is_dir():
        return {}
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}
