# `make` or `make help`: the targets and their variables, one line each.
# The two commands (see README.md):
#   make run    - bootstrap an environment, run all notebooks through papermill
#                 (profile `full` on a CUDA GPU, `smoke` on the CPU interpreter);
#                 SOLUTIONS=a.json,dir/ adds flashinfer-bench solutions to every
#                 notebook of their op (docs/solutions.md). The runner's status is
#                 printed on failure: 1 a notebook failed or a solution never passed
#                 the gate, 2 bad arguments (make itself then exits 2 either way)
#   make test   - bootstrap an environment, run the whole test suite (CPU: two
#                 pytest-xdist workers, ~11-14 minutes on 2 CPU cores; TEST_WORKERS=0: one process)
# and helpers:
#   make lab     - JupyterLab on notebooks/ with this environment's `python3` kernel
#                  (a notebook run there uses profile/output_root "auto": the same
#                  profile as `make run`, results into the repository's results/;
#                  saving a suite notebook there writes it without outputs, so
#                  git status stays clean: kernels/lab.py, docs/notebooks.md)
#   make clean   - smoke results, build/ and Python/pytest caches; CLEAN_VENV=1 also .venv
#   make html [HTML_FROM=results]
#                 every executed notebook under HTML_FROM rendered to an .html beside
#                 it (nbconvert; git-ignored: the runner writes none)
#   make compare A=results/<gpu-a> B=results/<gpu-b> [OUT=results/compare]
#                 [COMPARE_ARGS=--allow-unlike]: refuses (exit 2) two runs whose timing
#                 methods differ in revision (provenance timing_methods_rev) unless told
#   make pack OP=decode|prefill [VARIANT=fused|graph] [PACK_OUT=build/contest]
#                 our kernels as a flashinfer-bench solution (PACK_OUT/<name>.json)
#   make contest-eval [SOLUTIONS=a.json,kit-folder/] [CONTEST_ARGS="--ops decode"]
#                 the contest's flashinfer-bench (CUPTI spans; scripts/contest_wheel.sh) on
#                 ours, FlashInfer's baseline and SOLUTIONS (CUDA GPU) ->
#                 results/<gpu>/contest_<op>/ (scores, per-workload table, traces);
#                 docs/contest.md
#
# `make test` first runs scripts/install_browser.sh (Debian chromium + chromedriver
# for the JupyterLab browser test, when root or password-less sudo can apt-get;
# otherwise that test skips with a reason, or fails where GDN_REQUIRE_BROWSER=1, as in CI).
#
# scripts/bootstrap.sh prints the python to use (.venv/bin/python on a CPU
# machine; the host's python3 where it already has a CUDA torch).
# TRITON_INTERPRET: 1 when that python sees no CUDA GPU, unless already set;
# tests/conftest.py and kernels/runner.py apply the same rule.
PROFILE ?= auto
NOTEBOOKS ?= all
RUN_ARGS ?=
SOLUTIONS ?=
# skip reasons and the 15 slowest tests
PYTEST_ARGS ?= -rs --durations=15
# pytest-xdist workers (the `test` extra) where the Triton kernels run on the CPU
# interpreter: `-n TEST_WORKERS --dist load` hands out one test at a time, except that a
# module whose tests share one costly fixture (the notebook smoke run, JupyterLab) goes
# to one worker whole (tests/conftest.py). On a GPU host (or without pytest-xdist) one
# process, so no two timing tests share the GPU.
TEST_WORKERS ?= 2
HTML_FROM ?= results
OUT ?= results/compare
# --allow-unlike: compare runs whose timing methods differ in revision (marked)
COMPARE_ARGS ?=
PACK_OUT ?= build/contest
CONTEST_ARGS ?=
LAB_ARGS ?=
CLEAN_VENV ?=
# an environment already built (a Python with the suite's packages): used as is, without
# scripts/bootstrap.sh; empty (default): bootstrap builds or re-checks one and prints it
SUITE_PYTHON ?=
BOOT = $(if $(SUITE_PYTHON),$(SUITE_PYTHON),$$(scripts/bootstrap.sh))

INTERPRET = TRITON_INTERPRET=$${TRITON_INTERPRET-$$($$PY -c 'import torch;print(0 if torch.cuda.is_available() else 1)')}

.PHONY: help run test lab html compare bootstrap pack contest-eval clean
.DEFAULT_GOAL := help

help:
	@echo 'make run [PROFILE=auto|smoke|full] [NOTEBOOKS=all|01,02] [SOLUTIONS=a.json,kit/] [RUN_ARGS=--solutions-may-fail]   the notebooks'
	@echo '         (on failure it prints the runner'\''s status: 1 a notebook failed or a solution never passed, 2 bad arguments)'
	@echo 'any target: SUITE_PYTHON=/path/to/python uses that environment as is (no bootstrap)'
	@echo 'make test [PYTEST_ARGS="-rs --durations=15"] [TEST_WORKERS=2]   bootstrap, run the whole test suite'
	@echo 'make lab [LAB_ARGS=...]                         JupyterLab on notebooks/ with this environment'
	@echo 'make html [HTML_FROM=results]                   render the executed notebooks to HTML beside them'
	@echo 'make compare A=results/<gpu-a> B=results/<gpu-b> [OUT=results/compare] [COMPARE_ARGS=--allow-unlike]   compare two GPUs'\'' results'
	@echo 'make pack OP=decode|prefill [VARIANT=fused|graph] [PACK_OUT=build/contest]   our kernels as a solution'
	@echo 'make contest-eval [SOLUTIONS=...] [CONTEST_ARGS="--ops decode"]   flashinfer-bench on ours, baseline, SOLUTIONS'
	@echo 'make bootstrap                                  only build the environment; prints its python'
	@echo 'make clean [CLEAN_VENV=1]                       delete results/smoke, build/, caches (and .venv with CLEAN_VENV=1)'

clean:
	rm -rf results/smoke build .pytest_cache
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +
	$(if $(CLEAN_VENV),rm -rf .venv)

bootstrap:
	@scripts/bootstrap.sh

# the runner's exit status, said on make's last lines: GNU make itself exits 2 whenever a
# command fails, so `make run`'s own status cannot tell 1 from 2 (make prints "Error 1" /
# "Error 2"; scripts that branch on it run `python -m kernels.runner` directly, README)
run:
	@PY=$(BOOT) && export $(INTERPRET) && \
	  { $$PY -m kernels.runner --profile $(PROFILE) --notebooks $(NOTEBOOKS) \
	    $(if $(SOLUTIONS),--solutions $(SOLUTIONS)) $(RUN_ARGS); rc=$$?; \
	  case $$rc in \
	    0) ;; \
	    1) echo "make run: the runner exited 1: a notebook failed or a requested solution never passed the gate (summary above)" >&2 ;; \
	    2) echo "make run: the runner exited 2: bad arguments (a profile, notebook, parameter or solution refused) or another run holds the output root; nothing ran" >&2 ;; \
	    *) echo "make run: the runner exited $$rc (130/143: interrupted)" >&2 ;; \
	  esac; exit $$rc; }

test:
	@PY=$(BOOT) && scripts/install_browser.sh $$PY && export $(INTERPRET) && \
	  { $$PY -c 'import pytest' 2>/dev/null || { echo "make test: $$PY has no pytest (on the offline GPU host put it on PYTHONPATH)" >&2; exit 1; }; } && \
	  XDIST=$$([ "$$TRITON_INTERPRET" = 1 ] && [ "$(TEST_WORKERS)" != 0 ] && \
	    $$PY -c 'import xdist' 2>/dev/null && echo "-n $(TEST_WORKERS) --dist load" || :) && \
	  $$PY -m pytest $$XDIST $(PYTEST_ARGS) tests

lab:
	@PY=$(BOOT) && export $(INTERPRET) && \
	  { $$PY -c 'import jupyterlab' 2>/dev/null || { echo "make lab: $$PY has no jupyterlab (the lab extra; the offline GPU host has none)" >&2; exit 1; }; } && \
	  $$PY -m kernels.lab $(LAB_ARGS)

html:
	@PY=$(BOOT) && \
	  find $(HTML_FROM) -name '[0-9][0-9]_*.ipynb' -not -path '*/.*' -print0 | \
	  xargs -0 -r $$PY -m nbconvert --to html

compare:
	@test -n "$(A)" -a -n "$(B)" || { echo "usage: make compare A=results/<gpu-a> B=results/<gpu-b> [OUT=$(OUT)]" >&2; exit 2; }
	@PY=$(BOOT) && $$PY -m kernels.compare $(A) $(B) --out $(OUT) $(COMPARE_ARGS)

pack:
	@test "$(OP)" = decode -o "$(OP)" = prefill || { echo "usage: make pack OP=decode|prefill [VARIANT=fused|graph] [PACK_OUT=$(PACK_OUT)]" >&2; exit 2; }
	@PY=$(BOOT) && $$PY -m kernels.contest pack --op $(OP) $(if $(VARIANT),--variant $(VARIANT)) --out $(PACK_OUT)

contest-eval:
	@PY=$(BOOT) && $$PY -m kernels.contest evaluate $(if $(SOLUTIONS),--solutions $(SOLUTIONS)) $(CONTEST_ARGS)
