# The two set-up commands (see README):
#   make run    - bootstrap an environment, run all notebooks through papermill
#                 (profile `full` on a GPU, `smoke` on the CPU interpreter)
#   make test   - bootstrap an environment, run the whole test suite
PROFILE ?= auto
NOTEBOOKS ?= all

.PHONY: run test
run:
	@PY=$$(scripts/bootstrap.sh) && $$PY -m kernels.runner --profile $(PROFILE) --notebooks $(NOTEBOOKS)

test:
	@PY=$$(scripts/bootstrap.sh) && TRITON_INTERPRET=$${TRITON_INTERPRET-$$($$PY -c 'import torch;print(0 if torch.cuda.is_available() else 1)')} $$PY -m pytest -q tests
