#!/usr/bin/env bash
# Runs the whole test suite:
#   1. formatting (clang-format, .clang-format at the root)
#   2. unit and end-to-end tests (ctest; the e2e tests boot real guests)
#   3. the unit tests again under AddressSanitizer + UBSan (skip with TRYBOX_ASAN=0)
# Installs missing packages, builds, and (re)builds the default image first; the image's
# root filesystem is cached, so a rebuild after the first takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

echo "== format"
if ! clang-format --dry-run --Werror $(git ls-files '*.cc' '*.h'); then
  echo "format: run clang-format -i on the files above" >&2
  exit 1
fi

scripts/build.sh
build/bin/trybox image build debian-12
# The MCP SDK client the MCP e2e test drives `trybox mcp` with (versions pinned by the lock).
npm ci --prefix tests/mcp --no-audit --no-fund --loglevel=error >/dev/null

echo "== tests"
(cd build && ctest --output-on-failure --timeout 1500 "$@")

if [ "${TRYBOX_ASAN:-1}" != "0" ]; then
  echo "== unit tests under ASan+UBSan"
  cmake -S . -B build-asan -G Ninja -DTRYBOX_SANITIZE=ON >/dev/null
  ninja -C build-asan unit_tests
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
    ctest --output-on-failure -L unit)
fi
