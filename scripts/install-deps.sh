#!/usr/bin/env bash
# Installs the Debian packages trybox needs to build, test and run. Idempotent: installs
# only what is missing. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  # build: g++ (scripts/build.sh); clang with its sanitizer and libFuzzer runtimes
  # (scripts/test.sh's ASan build of the unit tests and the fuzzers)
  cmake ninja-build g++ clang libclang-rt-dev pkg-config ccache
  # libraries
  nlohmann-json3-dev libcli11-dev libsqlite3-dev libssl-dev libarchive-dev nettle-dev libcurl4-openssl-dev
  libmicrohttpd-dev libext2fs-dev libnghttp2-dev zlib1g-dev
  libgtest-dev libgmock-dev libseccomp-dev
  # running VMs and building images
  qemu-system-x86 qemu-utils mmdebstrap e2fsprogs kmod xz-utils dpkg-dev
  # tests and benchmarks (tmux: the terminal tests drive `trybox shell` in it)
  procps clang-format git tmux curl
  # the timekeeping e2e test steps the daemon's wall clock with libfaketime
  faketime
  # egress tests: a local TLS upstream (openssl s_server), QEMU's namespace (nsenter, ip)
  openssl util-linux iproute2
  # the dashboard's e2e test and bench drive it in headless Chromium (tests/ui, puppeteer-core,
  # which downloads no browser of its own)
  chromium
  # template_bench's peer: Anthropic's `srt` process sandbox (scripts/bench.sh installs it
  # from npm) runs its commands under bubblewrap, with socat and ripgrep
  bubblewrap socat ripgrep
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# The MCP end-to-end test runs the official SDK client (tests/mcp) under node; any node
# already installed will do.
if ! command -v node >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
# The REST e2e test runs a Python `requests` script (tests/rest); any python3 with requests
# importable will do.
if ! python3 -c 'import requests' >/dev/null 2>&1; then
  missing+=(python3 python3-requests)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
