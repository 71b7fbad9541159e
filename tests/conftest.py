"""Shared test set-up.

* ``TRITON_INTERPRET``: set to ``1`` when no CUDA GPU is visible, *before*
  anything imports triton (the Makefile exports the same value computed the
  same way; an explicit value in the environment always wins).
* Markers: ``gpu`` (needs a CUDA GPU; skipped with a reason elsewhere) and
  ``slow`` (notebook smoke runs, minutes; they run in CI too).
* :func:`requires_gpu` / the ``cuda_device`` fixture for GPU-only tests.
* ``GDN_OUTPUT_ROOT`` points at a temporary folder for the whole session
  (:func:`_results_elsewhere`): a notebook run with ``output_root="auto"`` (JupyterLab, the
  experiments' own collectors) writes there, never into the ``results/`` a user's
  ``make run`` wrote. Tests that run the runner pass ``--output-root`` themselves.
* Under pytest-xdist (``make test`` on the CPU: ``-n 2 --dist load``) the modules of
  :data:`SHARED_FIXTURE_MODULES` each go to one worker whole (:func:`pytest_xdist_make_scheduler`).
"""
from __future__ import annotations

import os
import sys


def _cuda_available() -> bool:
    try:
        import torch  # importing torch does not import triton
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


HAS_CUDA = _cuda_available()
if "TRITON_INTERPRET" not in os.environ:
    if "triton" in sys.modules:  # pragma: no cover - would make the setting useless
        raise RuntimeError("triton was imported before tests/conftest.py could set TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0" if HAS_CUDA else "1"
INTERPRET = os.environ["TRITON_INTERPRET"] == "1"

import pytest  # noqa: E402

NO_GPU_REASON = "needs a CUDA GPU (none visible; CPU runs use the Triton interpreter)"

#: Decorator for GPU-only tests: ``@requires_gpu``.
requires_gpu = pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with a reason on CPU)")
    config.addinivalue_line("markers", "slow: notebook smoke runs (minutes); run in CI too")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip with a reason when no CUDA GPU is visible."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason=NO_GPU_REASON)
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not item.keywords: ids like "gpu" match
            item.add_marker(skip)


#: Modules whose tests share one costly module-scoped fixture: one smoke run of every
#: notebook; one JupyterLab server and browser. Split over workers, each worker would
#: build it again.
SHARED_FIXTURE_MODULES = ("test_smoke.py", "test_lab_browser.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist load``: xdist's per-test load balancing, except that each module of
    :data:`SHARED_FIXTURE_MODULES` is one unit of work, handed out first (the largest units
    go first). ``xdist_group`` marks would say the same, but pytest-xdist 3.8 applies them
    by rewriting ``item._nodeid``, which pytest 9 no longer reads: they group nothing."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module.rsplit("/", 1)[-1] in SHARED_FIXTURE_MODULES else nodeid

    return SharedFixtureScheduling(config, log)


def pytest_report_header(config):
    return (f"gdn: cuda={'yes' if HAS_CUDA else 'no'} "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}")


@pytest.fixture(scope="session", autouse=True)
def _results_elsewhere(tmp_path_factory):
    """``GDN_OUTPUT_ROOT`` (:data:`kernels.runner.OUTPUT_ROOT_ENV`) = a session temporary
    folder, whatever the caller's environment says; restored at the end."""
    from kernels.runner import OUTPUT_ROOT_ENV

    before = os.environ.get(OUTPUT_ROOT_ENV)
    os.environ[OUTPUT_ROOT_ENV] = str(tmp_path_factory.mktemp("auto-results"))
    yield os.environ[OUTPUT_ROOT_ENV]
    if before is None:
        os.environ.pop(OUTPUT_ROOT_ENV, None)
    else:
        os.environ[OUTPUT_ROOT_ENV] = before


@pytest.fixture
def cuda_device():
    """``"cuda"`` on a GPU host; skips the test with a reason otherwise."""
    if not HAS_CUDA:
        pytest.skip(NO_GPU_REASON)
    return "cuda"


@pytest.fixture
def interpret():
    """True when Triton kernels run on the CPU interpreter in this session."""
    return INTERPRET
