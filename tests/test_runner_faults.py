"""kernels.runner under faults: a run killed with SIGKILL mid-notebook, two runs at once.

A toy notebook writes through :class:`kernels.bench.results.ResultWriter` (as the real
notebooks do), records its kernel's pid, then sleeps ``sleep_s`` before committing, so
the test can kill the run while the temporary folder is half written.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook extra is not installed")
pytest.importorskip("papermill", reason="the notebook extra is not installed")
yaml = pytest.importorskip("yaml", reason="the notebook extra is not installed")

from kernels import runner  # noqa: E402
from kernels.bench.results import ResultWriter, sweep_leftovers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

PARAMS = '''device: str = "auto"  # auto | cuda | cpu
output_root: str = "results"  # results root
profile: str = "smoke"  # profile name
n: int = 1  # what the notebook writes
sleep_s: float = 0.0  # pause before the commit
'''
WORK = '''import os, time
from pathlib import Path
from kernels.bench.results import ResultWriter
w = ResultWriter("01_kill", root=output_root).open()
(w.dir / "value.txt").write_text(str(n))
Path(output_root, "kernel.pid").write_text(str(os.getpid()))
time.sleep(sleep_s)
w.commit()
'''


@pytest.fixture
def toy(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(WORK)]
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    nbformat.write(nb, str(nbdir / "01_kill.ipynb"))
    out = tmp_path / "results"
    prof = tmp_path / "toy.yaml"
    prof.write_text(yaml.safe_dump({"defaults": {"output_root": str(out)}, "01_kill": {}}))
    return dict(nbdir=nbdir, out=out, profile=prof, slug=runner.current_gpu_slug())


def _argv(toy, *extra):
    return ["--profile", str(toy["profile"]), "--notebook-dir", str(toy["nbdir"]),
            "--no-progress", *extra]


def _spawn(toy, *extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "kernels.runner", *_argv(toy, *extra)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _wait_for(path: Path, proc, timeout=120.0):
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.communicate()}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.2)


def _kill_run(proc, pid_file: Path):
    """SIGKILL the runner's process group and the notebook's kernel (both started here)."""
    kernel = int(pid_file.read_text())
    os.killpg(proc.pid, signal.SIGKILL)
    try:
        os.kill(kernel, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_sigkill_mid_notebook_keeps_last_good_and_next_run_cleans(toy):
    d = toy["out"] / toy["slug"]
    assert runner.main(_argv(toy, "-p", "n=1")) == 0
    assert (d / "01_kill" / "value.txt").read_text() == "1"

    pid_file = toy["out"] / "kernel.pid"
    pid_file.unlink()
    proc = _spawn(toy, "-p", "n=2", "-p", "sleep_s=600")
    try:
        _wait_for(pid_file, proc)
    finally:
        _kill_run(proc, pid_file) if pid_file.exists() else os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert (d / "01_kill" / "value.txt").read_text() == "1"       # last good in place
    left = sorted(p.name for p in d.glob(".tmp-*"))
    assert any(n.startswith(".tmp-01_kill-") for n in left), left  # the killed run's folder
    assert any(n.startswith(".tmp-run-01_kill-") for n in left), left

    assert runner.main(_argv(toy, "-p", "n=3")) == 0                  # the next run cleans
    assert not list(d.glob(".tmp-*")) and not list(d.glob(".old-*"))
    assert (d / "01_kill" / "value.txt").read_text() == "3"


def test_sigterm_mid_notebook_keeps_the_cells_run_so_far(toy):
    """SIGTERM (what ``timeout`` sends) mid-notebook: the runner exits 143 naming the kept
    notebook, ``failed-<stem>.ipynb`` holds the cells that ran (with papermill's
    durations), the last good results stay, the lock is released."""
    d = toy["out"] / toy["slug"]
    assert runner.main(_argv(toy, "-p", "n=1")) == 0
    pid_file = toy["out"] / "kernel.pid"
    pid_file.unlink()
    proc = _spawn(toy, "-p", "n=2", "-p", "sleep_s=600")
    try:
        _wait_for(pid_file, proc)
        time.sleep(1.0)                      # the work cell is running (and saved as such)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    kept = d / "failed-01_kill.ipynb"
    assert "INTERRUPTED 01_kill" in err and str(kept) in err
    nb = nbformat.read(str(kept), as_version=4)
    params = nb.cells[0]
    assert params.metadata["papermill"]["status"] == "completed"
    assert params.metadata["papermill"]["duration"] is not None
    assert (d / "01_kill" / "value.txt").read_text() == "1"       # last good in place
    assert runner.main(_argv(toy, "-p", "n=3")) == 0                  # lock released
    assert (d / "01_kill" / "value.txt").read_text() == "3" and not kept.exists()


def test_sweep_restores_results_caught_between_the_renames(tmp_path):
    d = tmp_path / "cpu"
    (d / ".old-02_x-123").mkdir(parents=True)             # killed after final -> old
    (d / ".old-02_x-123" / "a.csv").write_text("good")
    (d / ".tmp-02_x-123").mkdir()                         # ... before tmp -> final
    (d / "03_y").mkdir()
    (d / ".old-03_y-9").mkdir()                           # final already in place
    lines = sweep_leftovers(d)
    assert (d / "02_x" / "a.csv").read_text() == "good"
    assert (d / "03_y").is_dir()
    assert sorted(p.name for p in d.iterdir()) == ["02_x", "03_y"]
    assert len(lines) == 3 and any("restored" in ln for ln in lines)


def test_second_run_into_the_same_root_is_refused(toy, capsys):
    pid_file = toy["out"] / "kernel.pid"
    proc = _spawn(toy, "-p", "sleep_s=600")
    try:
        _wait_for(pid_file, proc)
        lock = json.loads((toy["out"] / runner.LOCK_NAME).read_text())
        assert lock["pid"] == proc.pid and "kernels.runner" in lock["command"]
        assert runner.main(_argv(toy)) == 2
        err = capsys.readouterr().err
        assert f"another run is writing into {toy['out'].resolve()}" in err
        assert f"pid {proc.pid}" in err and lock["started"] in err and "kernels.runner" in err
        assert not (toy["out"] / toy["slug"] / "01_kill").exists()   # nothing interleaved
    finally:
        _kill_run(proc, pid_file)
    # the OS dropped the killed run's lock: the next run goes ahead
    assert runner.main(_argv(toy)) == 0
    assert (toy["out"] / toy["slug"] / "01_kill" / "value.txt").read_text() == "1"


def test_lock_released_after_a_run(tmp_path):
    with runner.RunLock(tmp_path):
        with pytest.raises(runner.RunnerError, match=f"pid {os.getpid()}"):
            runner.RunLock(tmp_path).acquire()
    with runner.RunLock(tmp_path):   # free again
        pass
    assert not (tmp_path / runner.LOCK_NAME).exists()   # nothing left behind


def test_a_finished_run_is_quiet_and_leaves_no_lock(toy):
    """A whole run (a subprocess, as ``make run``): the kernel talks over local sockets,
    so no "running over TCP without encryption" warning per notebook; no lock file left."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "kernels.runner", *_argv(toy)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "without encryption" not in res.stdout + res.stderr
    assert "1/1 notebooks ok" in res.stdout
    assert not (toy["out"] / runner.LOCK_NAME).exists()


def test_lock_taken_on_a_file_unlinked_meanwhile_is_retried(tmp_path, monkeypatch):
    """A run that opened the lock file just before the holder released (unlinked) it
    must not hold a lock on the orphaned file: it retries on the path's new file."""
    import fcntl as _fcntl

    real_flock, calls = _fcntl.flock, []

    def flock(fd, op):
        if op & _fcntl.LOCK_EX and not calls:   # the holder releases between open and flock
            calls.append(fd)
            os.unlink(tmp_path / runner.LOCK_NAME)
        return real_flock(fd, op)

    monkeypatch.setattr(runner.fcntl, "flock", flock)
    lock = runner.RunLock(tmp_path).acquire()
    try:
        assert calls and os.fstat(lock._fd).st_ino == os.stat(tmp_path / runner.LOCK_NAME).st_ino
    finally:
        lock.release()


def test_result_writer_tmp_name_is_swept(tmp_path):
    w = ResultWriter("04_z", root=tmp_path, gpu="cpu").open()
    (w.dir / "x.csv").write_text("1")
    assert w.dir.name.startswith(".tmp-")   # what sweep_leftovers removes
    assert sweep_leftovers(tmp_path / "cpu") == [f"removed leftover {w.dir}"]
