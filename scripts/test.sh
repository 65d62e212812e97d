#!/usr/bin/env bash
# Runs the whole test suite:
#   1. formatting (clang-format, .clang-format at the root)
#   2. unit tests, then the end-to-end suites side by side (each boots real guests under its
#      own private tryboxd; TRYBOX_E2E_JOBS of them at a time, default 3)
#   3. a clang build with ASan+UBSan and -Wthread-safety: the unit tests again, and every
#      fuzz target for TRYBOX_FUZZ_SECONDS each (default 30); skip with TRYBOX_ASAN=0
# Installs missing packages, builds, and (re)builds the default image first; the image's
# root filesystem is cached, so a rebuild after the first takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
start=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - start )) s in)"; }

stage "format"
if ! clang-format --dry-run --Werror $(git ls-files '*.cc' '*.h'); then
  echo "format: run clang-format -i on the files above" >&2
  exit 1
fi

stage "build"
scripts/build.sh
build/bin/trybox image build debian-12
# The developer image DevImageSecretsE2E boots (Node's fetch); a no-op when it is current. Built
# here, with the user's warm package cache, rather than inside the suite's 1500 s ctest limit.
build/bin/trybox image build debian-12-dev
# The MCP SDK client the MCP e2e test drives `trybox mcp` with (versions pinned by the lock).
npm ci --prefix tests/mcp --no-audit --no-fund --loglevel=error >/dev/null
# The official E2B SDK the HTTP API's e2e test drives (tests/e2b, pinned by its lock).
npm ci --prefix tests/e2b --no-audit --no-fund --loglevel=error >/dev/null
# puppeteer-core, which drives the dashboard in Debian's chromium (tests/ui, pinned by its lock).
npm ci --prefix tests/ui --no-audit --no-fund --loglevel=error >/dev/null

stage "unit tests"
(cd build && ctest --output-on-failure -L unit "$@")
stage "e2e tests"
(cd build && ctest --output-on-failure -L e2e -j "${TRYBOX_E2E_JOBS:-3}" --timeout 1500 "$@")

if [ "${TRYBOX_ASAN:-1}" != "0" ]; then
  stage "clang: ASan+UBSan, -Wthread-safety, fuzzers"
  launcher=()
  if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DTRYBOX_SANITIZE=ON \
    -DTRYBOX_THREAD_SAFETY=ON -DTRYBOX_FUZZ=ON "${launcher[@]}" >/dev/null
  fuzzers=(frame_fuzzer egress_fuzzer model_reply_fuzzer daemon_request_fuzzer guest_reply_fuzzer)
  ninja -C build-asan unit_tests "${fuzzers[@]}"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
    ctest --output-on-failure -L unit)
  for f in "${fuzzers[@]}"; do
    work=$(mktemp -d)
    mkdir "$work/corpus"
    if [ -d "fuzz/corpus/$f" ]; then cp -r "fuzz/corpus/$f/." "$work/corpus/"; fi
    echo "fuzz: $f for ${TRYBOX_FUZZ_SECONDS:-30} s"
    if ! (cd "$work" && "$OLDPWD/build-asan/bin/$f" -max_total_time="${TRYBOX_FUZZ_SECONDS:-30}" \
          -print_final_stats=1 corpus >log 2>&1); then
      tail -40 "$work/log" >&2
      echo "fuzz: $f found a crash (the input is in $work)" >&2
      exit 1
    fi
    grep -E "^stat::(number_of_executed_units|new_units_added)" "$work/log" || true
    rm -rf "$work"
  done
fi
stage "done"
