"""JupyterLab in a real browser: what a person does with ``make lab``, for every notebook.

Starts JupyterLab the way ``make lab`` does (``python -m kernels.lab``: the repository's
``notebooks/``, the save hook that strips outputs) on 127.0.0.1, a free port and a random
token, with autosave left on; headless Chromium (Debian's ``chromium`` + ``chromedriver``,
installed by ``scripts/install_browser.sh``) driven by Selenium opens each committed
notebook in turn and picks Run → Run All Cells. The parameters stay as committed
(``profile`` / ``output_root`` ``"auto"``), on the CPU interpreter (the server sees no
GPU), so each notebook runs the smoke profile; ``"auto"`` writes where ``GDN_OUTPUT_ROOT``
points, here the test's own folder (a person's ``make lab`` run: the repository's
``results/smoke/``, which this test leaves as it was). Checked per notebook: every code
cell ran, no cell shows an error, every figure the run saved is an ``<img>`` the browser
decoded, the provenance landed in ``<that root>/cpu-interpreter/<notebook>/`` with the
smoke values, and after a save the notebook file is byte for byte the committed one. One
server and one browser serve all notebooks; each notebook's kernel is shut down after its
test. A screenshot per notebook goes to ``<that root>/cpu-interpreter/jupyterlab_<notebook>.png``
(the test prints where).

Without jupyterlab, selenium, chromium or chromedriver the tests skip with the
reason; with ``GDN_REQUIRE_BROWSER=1`` (CI) they fail instead.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RUN_LIMIT_S = 600


def _missing() -> list:
    import importlib.util

    miss = [m for m in ("jupyterlab", "selenium") if importlib.util.find_spec(m) is None]
    miss += [b for b in ("chromium", "chromedriver") if shutil.which(b) is None]
    return miss


def _require():
    miss = _missing()
    if not miss:
        return
    msg = (f"JupyterLab browser test needs {', '.join(miss)} (make test installs chromium via "
           f"scripts/install_browser.sh where apt-get works; jupyterlab and selenium are the lab "
           f"and test extras)")
    if os.environ.get("GDN_REQUIRE_BROWSER") == "1":
        pytest.fail("GDN_REQUIRE_BROWSER=1: " + msg)
    pytest.skip(msg)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``make lab``'s JupyterLab (kernels.lab) with its own config, data and runtime
    folders, seeing no GPU; the app is exposed to the page so the test can save."""
    _require()
    tmp_path = tmp_path_factory.mktemp("lab")
    port, token = _free_port(), secrets.token_hex(16)
    cfg = tmp_path / "config"
    # no news / update prompt (it would fetch from the internet); autosave stays on
    f = cfg / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension" / \
        "notification.jupyterlab-settings"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    from kernels.runner import OUTPUT_ROOT_ENV
    from tests.results_guard import smoke_results_state

    results = tmp_path / "results"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(cfg), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), CUDA_VISIBLE_DEVICES="",
               TRITON_INTERPRET="1", MPLBACKEND="Agg", **{OUTPUT_ROOT_ENV: str(results)})
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in paths if p != str(ROOT)])
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernels.lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--port-retries=0", f"--IdentityProvider.token={token}",
         "--LabApp.expose_app_in_browser=True", f"--LabApp.workspaces_dir={tmp_path / 'ws'}"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"JupyterLab did not start: {(tmp_path / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield dict(base=base, token=token, log=tmp_path / "lab.log", results=results,
                   out=results / "cpu-interpreter", users=smoke_results_state())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    _require()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1000", f"--user-data-dir={tmp_path_factory.mktemp('chrome')}"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")),
                              options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _api(lab, method: str, path: str):
    req = urllib.request.Request(f"{lab['base']}{path}?token={lab['token']}", method=method)
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else None


def _click_menu(driver, wait, top: str, item: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    wait.until(EC.element_to_be_clickable(
        (By.XPATH, f"//div[contains(@class,'lm-MenuBar-itemLabel') and text()='{top}']"))).click()
    wait.until(EC.element_to_be_clickable(
        (By.XPATH, f"//div[contains(@class,'lm-Menu-itemLabel') and text()='{item}']"))).click()


# what the notebook's cells report in the page (evaluated by the browser)
_STATE_JS = r"""
const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
if (!nb) return null;
const prompts = [...nb.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim());
const errors = [...nb.querySelectorAll('.jp-OutputArea-output')]
  .filter(e => e.getAttribute('data-mime-type') === 'application/vnd.jupyter.stderr'
               && /Traceback \(most recent call last\)/.test(e.textContent))
  .map(e => e.textContent.slice(0, 2000));
const imgs = [...nb.querySelectorAll('.jp-OutputArea-output img')]
  .map(i => ({w: i.naturalWidth, h: i.naturalHeight, src: i.src.slice(0, 22)}));
return {prompts, errors, imgs};
"""

# save the open notebook through JupyterLab's own command (what autosave and Ctrl+S do)
_SAVE_JS = r"""
const done = arguments[arguments.length - 1];
window.jupyterapp.commands.execute('docmanager:save').then(() => done('ok'), e => done(String(e)));
"""


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_in_jupyterlab_in_chromium(lab, browser, notebook):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    stem = notebook[:-len(".ipynb")]
    path = ROOT / "notebooks" / notebook
    committed = path.read_bytes()
    started = time.time()
    # a workspace per notebook, so the page holds this notebook alone
    browser.get(f"{lab['base']}/lab/workspaces/{stem}/tree/{notebook}?reset&token={lab['token']}")
    wait = WebDriverWait(browser, 120)
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, ".jp-NotebookPanel .jp-CodeCell")))
    # JupyterLab may ask which kernel to start (preselected: the notebook's python3); accept
    time.sleep(2)
    for button in browser.find_elements(By.CSS_SELECTOR, ".jp-Dialog .jp-Dialog-button.jp-mod-accept"):
        button.click()
    wait.until(EC.invisibility_of_element_located((By.CSS_SELECTOR, ".jp-Dialog")))
    # the kernel is up when the toolbar's status reads idle
    wait.until(lambda d: d.execute_script(
        "const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
        ".jp-Notebook-ExecutionIndicator');"
        "return s && s.getAttribute('data-status') === 'idle';"))
    _click_menu(browser, wait, "Run", "Run All Cells")

    t0 = time.monotonic()
    state = None
    while time.monotonic() < t0 + RUN_LIMIT_S:
        state = browser.execute_script(_STATE_JS)
        if state and (state["errors"] or (state["prompts"] and all(
                re.fullmatch(r"\[\d+\]:", p) for p in state["prompts"]))):
            break
        if time.monotonic() > t0 + 60 and state and all(p == "[ ]:" for p in state["prompts"]):
            break   # Run All started nothing in a minute
        time.sleep(2)
    seconds = time.time() - started
    saved = browser.execute_async_script(_SAVE_JS)
    out = lab["out"]
    out.mkdir(parents=True, exist_ok=True)
    shot = out / f"jupyterlab_{stem}.png"
    imgs = browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
    if imgs:
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", imgs[0])
        time.sleep(0.5)
    browser.save_screenshot(str(shot))
    for session in _api(lab, "GET", "/api/sessions"):   # free the kernel for the next notebook
        _api(lab, "DELETE", f"/api/sessions/{session['id']}")
    print(f"JupyterLab Run All of {notebook}: {seconds:.0f} s; screenshot {shot}")

    assert state is not None, "the notebook never appeared in the page"
    assert not state["errors"], f"a cell of {notebook} failed in JupyterLab:\n" + \
        "\n---\n".join(state["errors"])
    assert state["prompts"] and all(re.fullmatch(r"\[\d+\]:", p) for p in state["prompts"]), (
        f"not every code cell of {notebook} ran within {RUN_LIMIT_S} s: prompts {state['prompts']}")
    # "auto": the smoke profile, into GDN_OUTPUT_ROOT (the test's folder) from notebooks/'s
    # kernel; the repository's results/smoke/ untouched
    from tests.results_guard import smoke_results_state

    assert smoke_results_state() == lab["users"], "the notebook wrote into results/smoke/"
    res = out / stem
    prov = json.loads((res / "provenance.json").read_text())
    assert (res / "provenance.json").stat().st_mtime >= started
    from kernels.runner import load_profile

    smoke = load_profile("smoke")
    assert prov["params"]["profile"] == "smoke"
    assert prov["params"]["output_root"] == str(lab["results"])
    for k, v in smoke["notebooks"][stem].items():
        assert prov["params"][k] == v, k
    drawn = [i for i in state["imgs"] if i["w"] > 0 and i["h"] > 0 and i["src"].startswith("data:image/png")]
    figures = list(res.glob("*.png"))
    assert len(drawn) >= len(figures), (
        f"{len(figures)} figures saved, {len(drawn)} shown as <img> in the page: {state['imgs']}")
    assert shot.stat().st_size > 10_000
    # the save went through the hook of `make lab`: the committed file, unchanged
    assert saved == "ok", f"saving {notebook} in JupyterLab failed: {saved}"
    assert path.stat().st_mtime >= started, "JupyterLab did not write the notebook"
    after = path.read_bytes()
    if after != committed:
        (res / f"saved-{notebook}").write_bytes(after)   # for the diff
        path.write_bytes(committed)                        # leave the checkout clean
    assert after == committed, (
        f"saving {notebook} in JupyterLab changed the committed file: diff it with "
        f"{res / f'saved-{notebook}'}")


@pytest.mark.parametrize("required", ["1", "0"])
def test_install_browser_says_why_it_cannot_and_fails_only_when_required(tmp_path, required):
    """scripts/install_browser.sh where there is no chromium: with a python lacking
    jupyterlab (nothing to install for) and with no apt-get; exit 1 only under
    GDN_REQUIRE_BROWSER=1."""
    import importlib.util

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("id",):
        os.symlink(shutil.which(tool), bin_ / tool)
    bare = tmp_path / "bare-python"
    bare.write_text("#!/bin/sh\nexit 1\n")   # a python where nothing imports
    bare.chmod(0o755)
    pythons = [(str(bare), "no jupyterlab/selenium")]
    if importlib.util.find_spec("jupyterlab") and importlib.util.find_spec("selenium"):
        pythons.append((sys.executable, "no apt-get"))
    for py, why in pythons:
        res = subprocess.run(["/bin/bash", str(ROOT / "scripts" / "install_browser.sh"), py],
                             env={"PATH": str(bin_), "GDN_REQUIRE_BROWSER": required},
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == (1 if required == "1" else 0), res.stderr
        assert why in res.stderr
        assert ("failing" in res.stderr) == (required == "1")
