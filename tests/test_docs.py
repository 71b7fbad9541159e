"""The documentation names only things that exist.

Every repository path and every ``make`` target that README.md and docs/*.md name, and
every link of docs/notes/*.md, must exist in this checkout: a path as a file or folder
(a path with a placeholder such as ``<gpu-slug>``, ``*`` or ``{a,b}``: its folder before
the placeholder; a path git ignores: a run's output, e.g. ``results/smoke/``), a link's
``#anchor`` as a heading of the page it points to, a target as a rule of the Makefile.

And docs/*.md describe the design as it is: no issue numbers, version tags (``v7``) or
references to the session log; the history lives in docs/notes/. docs/architecture.md
names every field of ``PrefillConfig``, and only those.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
NOTES = sorted((ROOT / "docs" / "notes").glob("*.md"))

# A repository path: starts at a top-level folder or file of this repository, not inside
# another path (``/root/...``, ``$OUT/...``, ``git show <sha>:scripts/...``, ``fla/ops/...``).
_TOP = r"(?:kernels|docs|scripts|tests|notebooks|results|\.ci)/[\w./<>*{},-]*|Makefile|pyproject\.toml|environment\.yml"
_PATH = re.compile(r"(?<![\w./:$~-])(" + _TOP + r")")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_MAKE = re.compile(r"\bmake\s+([a-z][\w-]*)")
# history in a design page: "issue 22", "issues #18", "v7" / "v5–v6" (not "v0.1.3"), the
# session log (notes/log.md, "lab log", "sixteenth session")
_HISTORY = re.compile(r"\bissues?\s*#?\d+|\bv\d+\b(?!\.\d)|\blog\.md\b|\blab[- ]log\b"
                      r"|\b(?:first|second|third|\w+th)\s+session\b", re.I)


def _ignored(rel: str) -> bool:
    """Whether git ignores ``rel`` (as a file or as a folder: it need not exist)."""
    return any(subprocess.run(["git", "check-ignore", "-q", "--no-index", p], cwd=ROOT).returncode == 0
               for p in (rel, rel.rstrip("/") + "/"))


def _exists(rel: str) -> bool:
    rel = rel.rstrip(".,").split("#")[0]
    cut = re.search(r"[<*{]|\.\.\.", rel)
    if cut:                                  # a pattern: its folder must exist
        rel = rel[:cut.start()].rsplit("/", 1)[0] if "/" in rel[:cut.start()] else ""
    return (ROOT / rel).exists() or _ignored(rel)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)}


def _links(page: Path):
    prose = _CODE.sub("", page.read_text())  # `kernel[grid](...)` is code, not a link
    for target in _LINK.findall(prose):
        if re.match(r"[a-z]+:", target):     # http:, https:, mailto:
            continue
        yield target


def _check_link(page: Path, target: str):
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"{page.name}: link to {target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        return f"{page.name}: link to {target}: no heading with that anchor"
    return None


def _makefile_targets() -> set:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def _ids(pages):
    return [pytest.param(p, id=str(p.relative_to(ROOT))) for p in pages]


@pytest.mark.parametrize("page", _ids(PAGES))
def test_every_named_path_exists(page):
    text = page.read_text()
    missing = sorted({p for p in _PATH.findall(text) if not _exists(p)})
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", _ids(PAGES + NOTES))
def test_every_link_resolves(page):
    bad = [e for e in (_check_link(page, t) for t in _links(page)) if e]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", _ids(PAGES))
def test_every_make_target_exists(page):
    targets = _makefile_targets()
    named = {t for code in _CODE.findall(page.read_text()) for t in _MAKE.findall(code)}
    assert not named - targets, (f"{page.relative_to(ROOT)} names make targets the Makefile "
                                 f"lacks: {sorted(named - targets)} (has {sorted(targets)})")


@pytest.mark.parametrize("page", _ids(sorted((ROOT / "docs").glob("*.md"))))
def test_design_pages_tell_no_history(page):
    found = sorted({m.group(0) for m in _HISTORY.finditer(page.read_text())})
    assert not found, (f"{page.relative_to(ROOT)} cites history {found}: describe the design "
                       "as it is and leave issues, versions and sessions to docs/notes/")


def test_architecture_names_every_prefill_config_field():
    from dataclasses import fields

    from kernels.prefill.config import PrefillConfig

    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"`PrefillConfig`, (\d+) fields: (.+?)\), no autotuning", text, re.S)
    assert m, "docs/architecture.md: the sentence `PrefillConfig`, N fields: ... is gone"
    want = [f.name for f in fields(PrefillConfig)]
    named = re.findall(r"`(\w+)`", m.group(2))
    assert int(m.group(1)) == len(want) and named == want, (
        f"docs/architecture.md lists PrefillConfig's fields as {m.group(1)}: {named}; "
        f"the code has {len(want)}: {want}")


def _committed_runs() -> dict:
    """{a committed run's path under the repository: its commit} from the records the
    results page's table is generated from (``kernels.report.committed_runs``)."""
    import json

    runs = {}
    for gpu in (ROOT / "results").iterdir():
        for rec in list(gpu.glob("*/provenance.json")) + list(gpu.glob("contest*/run.json")):
            runs[str(rec.parent.relative_to(ROOT))] = json.loads(rec.read_text())["git_sha"]
        for rec in gpu.glob("*.provenance.json"):
            csv = rec.with_name(rec.name[:-len(".provenance.json")] + ".csv")
            runs[str(csv.relative_to(ROOT))] = json.loads(rec.read_text())["git_sha"]
    return runs


_RUN_PATH = re.compile(r"results/[\w.-]+/[\w.-]+")
_SHA = re.compile(r"`([0-9a-f]{7,40})`")


def _commit_claims(text: str, runs: dict):
    """``(line, path, commit)`` for each commit named on a line that names a committed run
    and none of that line's runs has that commit."""
    for line in text.splitlines():
        named = {p.rstrip("/.") for p in _RUN_PATH.findall(line)} & set(runs)
        for sha in _SHA.findall(line) if named else ():
            if not any(runs[p].startswith(sha) for p in named):
                yield line.strip(), sorted(named), sha


def test_commits_named_beside_a_run_are_its_provenance():
    """A commit named on the same line as a committed run's path is that run's commit (from
    its provenance), so no page can say a run came from a commit it did not."""
    runs = _committed_runs()
    assert runs, "no committed run found under results/"
    pages = PAGES + NOTES + [ROOT / "results" / "README.md"]
    bad = [f"{page.relative_to(ROOT)}: `{sha}` beside {paths} (provenance: "
           f"{[runs[p][:7] for p in paths]}): {line[:120]}"
           for page in pages for line, paths, sha in _commit_claims(page.read_text(), runs)]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_should(tmp_path):
    """The matchers find a made-up path, a broken link and anchor, and a made-up target."""
    assert _PATH.findall("see `kernels/nope.py` and /root/kernels/x") == ["kernels/nope.py"]
    assert not _exists("kernels/nope.py") and _exists("kernels/decode_configs/<gpu-slug>.json")
    assert _exists("results/smoke/cpu-interpreter/")          # git-ignored run output
    page = tmp_path / "p.md"
    page.write_text("# A heading\n[x](nope.md) [y](#a-heading) [z](#missing)\n")
    errors = [_check_link(page, t) for t in _links(page)]
    assert errors[0] and errors[1] is None and errors[2]
    assert "bootstrap" in _makefile_targets() and "nope" not in _makefile_targets()
    history = ("removed in issue 22", "Issues #18", "the walk (v9)", "v5–v6", "notes/log.md",
               "the lab log", "Sixteenth session")
    assert all(_HISTORY.search(t) for t in history)
    runs = {"results/g/02_x": "46a3add" + "0" * 33}
    assert list(_commit_claims("`results/g/02_x/` at `8e8870f`", runs)) == [
        ("`results/g/02_x/` at `8e8870f`", ["results/g/02_x"], "8e8870f")]
    assert [c[2] for c in _commit_claims("`results/g/02_x/t.csv` at `46a3add`, `8e8870f`",
                                         runs)] == ["8e8870f"]
    assert not list(_commit_claims("notebook 02 at `8e8870f` (git history)", runs))
    assert not any(_HISTORY.search(t) for t in ("FlashInfer v0.7.2", "a process session",
                                                "`kv2`", "PR (#386)", "16 x 16 blocks"))
