#!/usr/bin/env bash
# Headless Chromium and its WebDriver from Debian's packages (chromium,
# chromium-driver) for tests/notebooks/test_lab_browser.py, which drives JupyterLab in it.
# Run by `make test` before pytest as `install_browser.sh PYTHON` (the suite's python).
# Installs only what is missing, only when PYTHON has jupyterlab and selenium (else the
# test skips anyway: the offline GPU host), and only where apt-get works as root or
# through password-less sudo. Where it cannot, it says
# why and exits 0 (the browser test then skips with a reason) — unless
# GDN_REQUIRE_BROWSER=1 (CI, .ci/run), where it exits 1.
set -euo pipefail
log() { echo "install_browser: $*" >&2; }
have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }
give_up() {
  log "$*"
  if [ "${GDN_REQUIRE_BROWSER:-0}" = 1 ]; then log "GDN_REQUIRE_BROWSER=1: failing"; exit 1; fi
  log "the JupyterLab browser test will skip"; exit 0
}
have && exit 0
PY=${1:-python3}
"$PY" -c 'import jupyterlab, selenium' 2>/dev/null \
  || give_up "$PY has no jupyterlab/selenium (the lab and test extras): no browser needed"
command -v apt-get >/dev/null 2>&1 || give_up "no chromium/chromedriver and no apt-get to install them"
if [ "$(id -u)" = 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  give_up "no chromium/chromedriver; installing them needs root or password-less sudo (apt-get install chromium chromium-driver)"
fi
log "apt-get install chromium chromium-driver (first time: a minute or two)"
start=$SECONDS
"${SUDO[@]}" apt-get update -qq >&2 || give_up "apt-get update failed"
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
  chromium chromium-driver >&2 || give_up "apt-get install chromium chromium-driver failed"
have || give_up "chromium/chromedriver still not on PATH after apt-get (not Debian's packages?)"
log "installed in $((SECONDS - start)) s: $(chromium --version 2>/dev/null)"
