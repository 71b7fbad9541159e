"""scripts/gpu_host.sh's background steps: a driver's steps are tarred as they finish and
each collect call hands over only the steps it has not handed over before (bash, no GPU)."""
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash(script: str, tmp_path: Path) -> str:
    pre = f"source {ROOT / 'scripts' / 'gpu_host.sh'}; STEPS={tmp_path / 'steps'}; "
    return subprocess.run(["bash", "-c", pre + script], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_steps_are_collected_once_each_with_their_status(tmp_path):
    res = tmp_path / "res"
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    # step a writes a result and succeeds; step b fails but its log and status still land
    first = _bash(f"mkdir -p {res}; gpu_step a {res} bash -c 'echo 1 > {res}/x.csv'; "
                  f"OUT={out1} gpu_collect 5", tmp_path)
    assert "collected a: rc 0" in first and "driver finished" not in first
    with tarfile.open(out1 / "a.tar") as t:
        assert "res/x.csv" in t.getnames()
    second = _bash(f"gpu_step b {res} false; touch $STEPS/ALL; OUT={out2} gpu_collect 5",
                   tmp_path)
    assert "collected b: rc 1" in second and "collected a" not in second
    assert "driver finished" in second and (out2 / "b.log").exists()
    assert not (out2 / "a.tar").exists()


def test_collect_returns_after_its_limit_when_nothing_finished(tmp_path):
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "slow.log").write_text("started\nhalfway\n")
    out = _bash(f"OUT={tmp_path / 'o'} gpu_collect 5", tmp_path)
    assert "running: slow" in out and "halfway" in out and "collected" not in out
