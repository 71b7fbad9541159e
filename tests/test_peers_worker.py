"""The peer worker on the CPU with a fake peers module: protocol, gate in the worker, timing
with the suite's instruments, unavailable peers, errors, and the worker's own PYTHONPATH."""
import os

import pytest

from kernels import peers_worker
from kernels.peers import Unavailable
from kernels.reference import prefill_reference
from kernels.spec import GDNShape, make_prefill_inputs

SMALL = GDNShape(2, 4, 16)
FAKE = "tests.fake_worker_peers:fake_peers"


@pytest.fixture(scope="module")
def data():
    inputs = make_prefill_inputs([5, 3], SMALL, seed=1)
    return inputs, prefill_reference(**inputs)


@pytest.fixture()
def worker():
    w = peers_worker.PeerWorker(FAKE, site="", timeout_s=120)
    yield w
    w.close()


def test_worker_env_puts_the_site_first():
    env = peers_worker.worker_env("/opt/qla", base={"PYTHONPATH": "/root/gpusite"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == "/opt/qla" and parts[-1] == "/root/gpusite"
    assert str(peers_worker._REPO_ROOT) in parts
    assert peers_worker.worker_env("", base={})["PYTHONPATH"] == str(peers_worker._REPO_ROOT)


def test_status_reports_availability_and_versions(worker):
    st = worker.status(["good", "missing"])
    assert st["good"] == dict(available=True, reason="", version="fake-1.0")
    assert not st["missing"]["available"] and "no peer 'missing'" in st["missing"]["reason"]
    assert st["_python"]["executable"]


def test_run_gates_then_times_in_the_worker(worker, data):
    inputs, ref = data
    path = worker.put("5+3", inputs, ref)
    res = worker.run("good", path, device="cpu", methods=["cpu_wall", "graph"], rep=2, warmup=0)
    assert res["gate"]["status"] == "pass" and res["gate"]["input_untouched"] is True
    wall, graph = res["timings"]
    assert wall["method"] == "cpu_wall" and wall["n"] == 2 and wall["median_us"] > 0
    assert graph["method"] == "graph" and "CUDA" in graph["error"]
    bad = worker.run("bad", path, device="cpu", methods=["cpu_wall"], rep=2, warmup=0)
    assert bad["gate"]["status"] == "fail" and bad["timings"] == []   # failing: not timed
    crash = worker.run("crash", path, device="cpu", methods=["cpu_wall"], rep=2, warmup=0)
    assert crash["gate"]["status"] == "error" and "fake peer failure" in crash["gate"]["reason"]
    assert worker.run("missing", path, device="cpu")["gate"]["status"] == "unavailable"


def test_put_writes_one_file_per_key(worker, data):
    inputs, ref = data
    p1 = worker.put("a", inputs, ref)
    assert worker.put("a", inputs, ref) == p1
    p2 = worker.put("b", inputs, ref)
    assert p2 != p1 and os.path.exists(p2) and not os.path.exists(p1)


def test_errors_are_reported_and_the_worker_keeps_serving(worker):
    with pytest.raises(peers_worker.WorkerError, match="unknown op"):
        worker.request({"op": "nope"})
    with pytest.raises(peers_worker.WorkerError, match="FileNotFoundError|No such file"):
        worker.run("good", "/nonexistent.pt", device="cpu")
    assert worker.status(["good"])["good"]["available"]


def test_remote_impls_and_site(monkeypatch, tmp_path, data):
    monkeypatch.setenv(peers_worker.SITE_ENV, str(tmp_path))
    try:
        impls = peers_worker.remote_prefill_impls(["good", "where"], serve=FAKE)
        good, where = impls["good"], impls["where"]
        assert isinstance(good, peers_worker.RemotePeer) and good and good.remote
        assert isinstance(where, Unavailable)
        assert f"PYTHONPATH={tmp_path}{os.pathsep}" in where.reason   # the site comes first
        inputs, ref = data
        res = good.run("k", inputs, ref, device="cpu", methods=["cpu_wall"], rep=1, warmup=0)
        assert res["gate"]["status"] == "pass" and res["timings"][0]["method"] == "cpu_wall"
    finally:
        peers_worker.close_workers()
    monkeypatch.setenv(peers_worker.SITE_ENV, str(tmp_path / "absent"))
    missing = peers_worker.remote_prefill_impls(["good"], serve=FAKE)["good"]
    assert not missing and "is not a folder" in missing.reason


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["flashqla", "fla_flashqla"])
def test_gpu_flashqla_peers_in_their_worker(name):
    """On a GPU host with GDN_QLA_SITE: the FlashQLA peers pass the gate and are timed."""
    from kernels.reference import prefill_reference_chunked

    try:
        peer = peers_worker.remote_prefill_impls([name])[name]
        if not peer:
            pytest.skip(peer.reason)
        for lens in ([64], [100, 28], [8192]):
            x = make_prefill_inputs(lens, device="cuda")
            res = peer.run(str(lens), x, prefill_reference_chunked(**x), device="cuda",
                           methods=["graph"], rep=3, warmup=2)
            assert res["gate"]["status"] == "pass", res["gate"]
            assert res["gate"]["input_untouched"] is True
            assert res["timings"][0]["method"] == "graph" and res["timings"][0]["median_us"] > 0
    finally:
        peers_worker.close_workers()


def test_remote_peer_frees_this_process_cache_before_the_worker_runs(monkeypatch, data):
    """The worker shares the GPU: the caller's cached CUDA blocks are released before each
    remote run (a 1M-token shape once left the worker 2.4 GiB of 80)."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    class FakeWorker:
        def put(self, key, inputs, reference):
            calls.append("put")
            return "path"

        def run(self, name, path, **kw):
            calls.append("run")
            return {"gate": {"status": "pass"}}

    peer = peers_worker.RemotePeer(FakeWorker(), "good", True)
    inputs, ref = data
    assert peer.run("k", inputs, ref, device="cuda")["gate"]["status"] == "pass"
    assert calls == ["put", "empty_cache", "run"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    calls.clear()
    peers_worker.release_cached_memory()
    assert calls == []   # a process that never touched CUDA starts no context



def test_worker_frees_its_cache_after_each_run(monkeypatch, data):
    """The notebook's process runs the in-process peers after a remote one on the same GPU:
    the worker gives its cached blocks back after every run, passing, failing or crashing
    (at 1M tokens FlashInfer once ran out of memory while the worker held 63.75 GiB)."""
    from tests import fake_worker_peers

    calls = []
    monkeypatch.setattr(peers_worker, "release_cached_memory", lambda: calls.append("release"))
    inputs, ref = data
    impls = {n: fn for n, (fn, _) in fake_worker_peers.fake_peers(["good", "bad", "crash"]).items()}
    for name, status in (("good", "pass"), ("bad", "fail"), ("crash", "error")):
        calls.clear()
        loaded = dict(path="already-loaded", inputs=inputs, ref=ref)
        req = dict(data="already-loaded", device="cpu", methods=["cpu_wall"], rep=1, warmup=0)
        res = peers_worker._run(req, impls[name], loaded)
        assert res["gate"]["status"] == status
        assert calls == ["release"], name


def test_kernel_calls_return_the_per_kernel_rows(data):
    from kernels.bench.anatomy import KERNEL_TIME_COLUMNS

    inputs, ref = data
    with peers_worker.PeerWorker("tests.fake_worker_peers:fake_peers_with_kernel_times",
                                 site="", timeout_s=120) as w:
        path = w.put("5+3", inputs, ref)
        res = w.run("good", path, device="cpu", kernel_calls=3)
        assert res["gate"]["status"] == "pass" and res["kernel_error"] == ""
        rows = res["kernel_rows"]
        assert [r["kernel"] for r in rows] == ["chunk_fwd<64>", "state_walk"]
        assert set(KERNEL_TIME_COLUMNS) <= set(rows[0]) and rows[1]["median_us"] == 20.0
        assert rows[0]["calls"] == 3 and rows[0]["k"] == 0
        bad = w.run("bad", path, device="cpu", kernel_calls=3)   # failing gate: no rows
        assert bad["gate"]["status"] == "fail" and bad["kernel_rows"] == []
        assert w.run("missing", path, device="cpu", kernel_calls=3)["kernel_rows"] == []


def test_kernel_calls_failure_is_a_reason_not_a_crash(worker, data):
    inputs, ref = data   # the real kernel_times: no CUDA on the CPU
    res = peers_worker.RemotePeer(worker, "good", True).run("5+3", inputs, ref, device="cpu",
                                                            kernel_calls=2)
    assert res["gate"]["status"] == "pass" and res["kernel_rows"] == []
    assert res["kernel_error"]
    assert worker.status(["good"])["good"]["available"]   # the worker keeps serving


def test_host_time_comes_before_the_requests_profiler_sessions(monkeypatch, data):
    """A request asking for a timeline and host time: ``host`` is timed before the timeline
    (a profiler session left the host slower on the H100), the other methods after it, and
    the rows keep every method once."""
    from kernels.bench import timeline, timing
    from tests import fake_worker_peers

    order = []
    monkeypatch.setattr(timing, "time_each",
                        lambda call, methods, rep, warmup: [dict(method=m) for m in methods
                                                            if not order.append(m)])

    class _Timeline:
        def summary(self):
            return {}
        gpu = []

    monkeypatch.setattr(timeline, "record_timeline",
                        lambda call: order.append("timeline") or _Timeline())
    inputs, ref = data
    good = fake_worker_peers.fake_peers(["good"])["good"][0]
    req = dict(data="already-loaded", device="cpu", methods=["cupti_cold", "graph", "host"],
               rep=1, warmup=0, timeline=True)
    res = peers_worker._run(req, good, dict(path="already-loaded", inputs=inputs, ref=ref))
    assert res["gate"]["status"] == "pass"
    assert order == ["host", "timeline", "cupti_cold", "graph"]
    assert [t["method"] for t in res["timings"]] == ["host", "cupti_cold", "graph"]
