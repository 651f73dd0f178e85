#!/usr/bin/env bash
# Installs the peers the slow test suites need, only when missing (idempotent):
#   * the real iac-code 0.16.0 kernel in a venv     (tests/realkernel, marker realkernel)
#       $AGUI_IAC_CODE_VENV, default ~/.cache/agui-adapter/iac-code-0.16.0
#   * the official AG-UI TS client @ag-ui/client 1.0.0 (tests/support/agui_check, marker official_client)
#       $AGUI_NODE_MODULES, default ~/.cache/agui-adapter/node/node_modules
#   * CopilotKit's runtime @copilotkit/runtime 1.75.0, its front-end core @copilotkit/core 1.74.0 (the one the
#       latest @copilotkit/react-core, 1.74.0, uses) and the @ag-ui/client 0.0.59 they both depend on (tests/compat/test_copilotkit.py, marker copilotkit; the recipe
#       examples/copilotkit/): $AGUI_COPILOTKIT_MODULES, default ~/.cache/agui-adapter/copilotkit/node_modules,
#       a prefix of its own so that the @ag-ui/client 1.0.0 install above stays as it is
#   * axe-core 4.10.2 (npm, same node prefix), injected into the console page by the browser suite
#   * Chromium and its WebDriver from Debian's packages chromium + chromium-driver (tests/browser,
#       marker browser): /usr/bin/chromium, /usr/bin/chromedriver; installed with apt-get (as root)
#   * nginx and openssl from Debian's packages (tests/compat/test_deploy_nginx.py, marker nginx):
#       the tests run /usr/sbin/nginx themselves, in the foreground on loopback ports with their own
#       configuration; the package's own service (port 80, if apt-get starts it) is not used
# The a2a-sdk pin is required: iac-code 0.16.0 resolves a2a-sdk 1.3.0, with which the
# kernel dies at start-up (ImportError: encode_page_token).
# Env: PYTHON (default python3) creates the venv. Exits non-zero, loudly, on any failure.
set -euo pipefail

KERNEL_VERSION="0.16.0"
A2A_SDK_VERSION="1.2.0"
AGUI_CLIENT_VERSION="1.0.0"
AXE_CORE_VERSION="4.10.2"
PYTHON="${PYTHON:-python3}"
VENV="${AGUI_IAC_CODE_VENV:-$HOME/.cache/agui-adapter/iac-code-${KERNEL_VERSION}}"
NODE_MODULES="${AGUI_NODE_MODULES:-$HOME/.cache/agui-adapter/node/node_modules}"
NODE_PREFIX="$(dirname "$NODE_MODULES")"
COPILOTKIT_VERSION="1.75.0"
COPILOTKIT_CORE_VERSION="1.74.0"
COPILOTKIT_AGUI_CLIENT_VERSION="0.0.59"
COPILOTKIT_MODULES="${AGUI_COPILOTKIT_MODULES:-$HOME/.cache/agui-adapter/copilotkit/node_modules}"
COPILOTKIT_PREFIX="$(dirname "$COPILOTKIT_MODULES")"

log() { printf 'setup-peers: %s\n' "$*"; }
die() { printf 'setup-peers: ERROR: %s\n' "$*" >&2; exit 1; }
trap 'die "command failed (line $LINENO): $BASH_COMMAND"' ERR

kernel_ok() {
  [ -x "$VENV/bin/iac-code" ] && [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" - "$KERNEL_VERSION" "$A2A_SDK_VERSION" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if (version("iac-code"), version("a2a-sdk")) == (sys.argv[1], sys.argv[2]) else 1)
EOF
}

setup_kernel() {
  if kernel_ok; then
    log "kernel: iac-code ${KERNEL_VERSION} + a2a-sdk ${A2A_SDK_VERSION} already in $VENV (nothing to do)"
    return
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PYTHON" >/dev/null || die "$PYTHON not found (needed to create the kernel venv)"
    log "kernel: creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
  else
    log "kernel: venv $VENV exists but the pinned packages are missing; installing them"
  fi
  log "kernel: pip install 'iac-code[a2a]==${KERNEL_VERSION}' 'a2a-sdk[http-server,signing]==${A2A_SDK_VERSION}' (takes ~1-2 min)"
  "$VENV/bin/pip" install --disable-pip-version-check -q \
    "iac-code[a2a]==${KERNEL_VERSION}" "a2a-sdk[http-server,signing]==${A2A_SDK_VERSION}"
  kernel_ok || die "kernel venv $VENV still lacks iac-code ${KERNEL_VERSION} / a2a-sdk ${A2A_SDK_VERSION} after install"
  log "kernel: installed ($("$VENV/bin/iac-code" --version 2>/dev/null | head -n 1 || echo "iac-code ${KERNEL_VERSION}"))"
}

node_package_version() {
  node -e 'try { process.stdout.write(require(process.argv[1]).version) } catch { process.exit(1) }' \
    "$NODE_MODULES/$1/package.json" 2>/dev/null
}

node_ok() {
  [ "$(node_package_version @ag-ui/client || true)" = "$AGUI_CLIENT_VERSION" ] &&
    [ "$(node_package_version @ag-ui/core || true)" = "$AGUI_CLIENT_VERSION" ] &&
    [ "$(node_package_version axe-core || true)" = "$AXE_CORE_VERSION" ]
}

setup_node() {
  command -v node >/dev/null || die "node not found (the official-client check needs Node.js >= 18)"
  node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' ||
    die "node $(node --version) is too old (need >= 18 for fetch/ReadableStream)"
  if node_ok; then
    log "node: @ag-ui/client@${AGUI_CLIENT_VERSION} + @ag-ui/core@${AGUI_CLIENT_VERSION} + axe-core@${AXE_CORE_VERSION} already in $NODE_MODULES (nothing to do)"
    return
  fi
  command -v npm >/dev/null || die "npm not found (needed to install @ag-ui/client)"
  mkdir -p "$NODE_PREFIX"
  log "node: npm install --prefix $NODE_PREFIX @ag-ui/client@${AGUI_CLIENT_VERSION} @ag-ui/core@${AGUI_CLIENT_VERSION} axe-core@${AXE_CORE_VERSION}"
  npm install --prefix "$NODE_PREFIX" --no-audit --no-fund --save-exact --loglevel=error \
    "@ag-ui/client@${AGUI_CLIENT_VERSION}" "@ag-ui/core@${AGUI_CLIENT_VERSION}" "axe-core@${AXE_CORE_VERSION}"
  node_ok || die "@ag-ui/client/@ag-ui/core ${AGUI_CLIENT_VERSION} or axe-core ${AXE_CORE_VERSION} still missing from $NODE_MODULES after npm install"
  log "node: installed into $NODE_MODULES"
}

copilotkit_version() {
  node -e 'try { process.stdout.write(require(process.argv[1]).version) } catch { process.exit(1) }' \
    "$COPILOTKIT_MODULES/$1/package.json" 2>/dev/null
}

copilotkit_ok() {
  [ "$(copilotkit_version @copilotkit/runtime || true)" = "$COPILOTKIT_VERSION" ] &&
    [ "$(copilotkit_version @copilotkit/core || true)" = "$COPILOTKIT_CORE_VERSION" ] &&
    [ "$(copilotkit_version @ag-ui/client || true)" = "$COPILOTKIT_AGUI_CLIENT_VERSION" ]
}

setup_copilotkit() {
  if copilotkit_ok; then
    log "copilotkit: @copilotkit/runtime@${COPILOTKIT_VERSION} + @copilotkit/core@${COPILOTKIT_CORE_VERSION} + @ag-ui/client@${COPILOTKIT_AGUI_CLIENT_VERSION} already in $COPILOTKIT_MODULES (nothing to do)"
    return
  fi
  command -v npm >/dev/null || die "npm not found (needed to install @copilotkit/runtime)"
  mkdir -p "$COPILOTKIT_PREFIX"
  log "copilotkit: npm install --prefix $COPILOTKIT_PREFIX @copilotkit/runtime@${COPILOTKIT_VERSION} @copilotkit/core@${COPILOTKIT_CORE_VERSION} @ag-ui/client@${COPILOTKIT_AGUI_CLIENT_VERSION} (takes ~1-2 min)"
  SCARF_ANALYTICS=false DO_NOT_TRACK=1 npm install --prefix "$COPILOTKIT_PREFIX" --no-audit --no-fund --save-exact \
    --loglevel=error "@copilotkit/runtime@${COPILOTKIT_VERSION}" "@copilotkit/core@${COPILOTKIT_CORE_VERSION}" \
    "@ag-ui/client@${COPILOTKIT_AGUI_CLIENT_VERSION}"
  copilotkit_ok || die "@copilotkit/runtime ${COPILOTKIT_VERSION}, @copilotkit/core ${COPILOTKIT_CORE_VERSION} or @ag-ui/client ${COPILOTKIT_AGUI_CLIENT_VERSION} still missing from $COPILOTKIT_MODULES after npm install"
  log "copilotkit: installed into $COPILOTKIT_MODULES"
}

browser_ok() {
  command -v chromium >/dev/null && command -v chromedriver >/dev/null
}

setup_browser() {
  if browser_ok; then
    log "browser: $(chromium --version 2>/dev/null | head -n 1) and chromedriver already installed (nothing to do)"
    return
  fi
  command -v apt-get >/dev/null || die "chromium/chromedriver missing and apt-get not found (install Debian's chromium + chromium-driver)"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "chromium/chromedriver missing; installing them needs root (apt-get install chromium chromium-driver)"
    sudo="sudo"
  fi
  log "browser: apt-get install chromium chromium-driver (takes ~1 min)"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium chromium-driver
  browser_ok || die "chromium/chromedriver still missing after apt-get install"
  log "browser: installed ($(chromium --version 2>/dev/null | head -n 1))"
}

nginx_bin() {
  command -v nginx 2>/dev/null || { [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx; }
}

nginx_ok() {
  nginx_bin >/dev/null && command -v openssl >/dev/null
}

setup_nginx() {
  if nginx_ok; then
    log "nginx: $("$(nginx_bin)" -v 2>&1 | head -n 1) and openssl already installed (nothing to do)"
    return
  fi
  command -v apt-get >/dev/null || die "nginx/openssl missing and apt-get not found (install Debian's nginx + openssl)"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "nginx/openssl missing; installing them needs root (apt-get install nginx openssl)"
    sudo="sudo"
  fi
  log "nginx: apt-get install nginx openssl"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q nginx openssl
  nginx_ok || die "nginx/openssl still missing after apt-get install"
  log "nginx: installed ($("$(nginx_bin)" -v 2>&1 | head -n 1))"
}

setup_kernel
setup_node
setup_copilotkit
setup_browser
setup_nginx
log "done (AGUI_IAC_CODE_VENV=$VENV AGUI_NODE_MODULES=$NODE_MODULES AGUI_COPILOTKIT_MODULES=$COPILOTKIT_MODULES)"
