#!/usr/bin/env bash
# Runs the whole test suite:
#   1. formatting (clang-format, .clang-format at the root)
#   2. the end-to-end suites side by side (each boots real guests under its own private
#      tryboxd; TRYBOX_E2E_JOBS of them at a time, default 3), from the build users get
#      (scripts/build.sh: gcc -O2, build/)
#   3. the unit tests, in a clang build with ASan+UBSan at -O0 and -Wthread-safety
#      (build-asan/; leaks checked), and every fuzz target for TRYBOX_FUZZ_SECONDS each
#      (default 30), two at a time; TRYBOX_ASAN=0 runs the unit tests from build/ instead
#      and no fuzzers
# Installs missing packages, builds, and (re)builds the default image first; the image's
# root filesystem is cached, so a rebuild after the first takes seconds. The developer image
# (debian-12-dev, 7-10 min from cold under TCG here, a no-op when current) builds in the
# background while the tests compile, and the e2e suites start once it is there: it uses
# one core (the guest's), the compilers the other. Each source is compiled once for each
# build that runs it: the unit tests only with the sanitizers, the e2e suites only without.
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

# The two background jobs below end with the script, however it ends, and so does the
# user's daemon when the image builds started it (with its spare clones).
dev_pid=""
asan_pid=""
started_daemon=0
stop_background() {
  # Ctrl-C or a failed stage: the CLI's own SIGINT handling destroys its build VM.
  if [ -n "$dev_pid" ] && kill -0 "$dev_pid" 2>/dev/null; then
    kill -INT "$dev_pid" 2>/dev/null || true
    wait "$dev_pid" 2>/dev/null || true
  fi
  if [ -n "$asan_pid" ] && kill -0 "$asan_pid" 2>/dev/null; then
    kill -TERM "$asan_pid" 2>/dev/null || true
    wait "$asan_pid" 2>/dev/null || true
  fi
  if [ "$started_daemon" = "1" ]; then build/bin/trybox daemon stop || true; fi
}
trap stop_background EXIT

# The clang build (ASan+UBSan at -O0, -Wthread-safety, libFuzzer: the unit tests and the
# fuzz targets) compiles at nice 19 from here to the end of the e2e stage: it takes only the
# CPU the other stages leave idle, and its tests run after the e2e suites, at normal
# priority.
asan=${TRYBOX_ASAN:-1}
fuzzers=(frame_fuzzer egress_fuzzer model_reply_fuzzer daemon_request_fuzzer guest_reply_fuzzer)
if [ "$asan" != "0" ]; then
  launcher=()
  if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DTRYBOX_SANITIZE=ON \
    -DTRYBOX_THREAD_SAFETY=ON -DTRYBOX_FUZZ=ON "${launcher[@]}" >/dev/null
  asan_log=$(mktemp /tmp/trybox-asan-build-XXXXXX.log)
  nice -n 19 ninja -C build-asan unit_tests "${fuzzers[@]}" >"$asan_log" 2>&1 &
  asan_pid=$!
  echo "clang build: in the background at nice 19 (pid $asan_pid, log $asan_log)"
fi

stage "build: the programs"
programs=(trybox trybox-tar trybox-image-build tryboxd trybox-agent trybox-ext4tar trybox-init)
scripts/build.sh "${programs[@]}"
# `daemon status` starts no daemon; the image build below does when none runs.
if ! build/bin/trybox daemon status >/dev/null 2>&1; then started_daemon=1; fi
build/bin/trybox image build debian-12

# The developer image DevImageSecretsE2E boots (Node's fetch), built with the user's warm
# package cache rather than inside the suite's 1500 s ctest limit. Nothing else until the
# e2e stage touches the image directory, whose lock a second build (or commit) would meet.
dev_log=$(mktemp /tmp/trybox-dev-image-XXXXXX.log)
TRYBOX_PROGRESS=always build/bin/trybox image build debian-12-dev >"$dev_log" 2>&1 &
dev_pid=$!
echo "debian-12-dev: building in the background (pid $dev_pid, log $dev_log)"

stage "build: e2e tests and benchmarks"
# Not unit_tests: they run in the clang build (unless TRYBOX_ASAN=0).
targets=(e2e_tests fake_model_server bench_compare)
for b in bench/*_bench.cc; do targets+=("$(basename "$b" .cc)"); done
if [ "$asan" = "0" ]; then targets+=(unit_tests); fi
scripts/build.sh "${targets[@]}"
# The MCP SDK client the MCP e2e test drives `trybox mcp` with (versions pinned by the lock).
npm ci --prefix tests/mcp --no-audit --no-fund --loglevel=error >/dev/null
# The official E2B SDK the HTTP API's e2e test drives (tests/e2b, pinned by its lock).
npm ci --prefix tests/e2b --no-audit --no-fund --loglevel=error >/dev/null
# puppeteer-core, which drives the dashboard in Debian's chromium (tests/ui, pinned by its lock).
npm ci --prefix tests/ui --no-audit --no-fund --loglevel=error >/dev/null

stage "waiting for debian-12-dev"
if ! wait "$dev_pid"; then
  tail -40 "$dev_log" >&2
  echo "debian-12-dev: the build failed (its whole log: $dev_log)" >&2
  exit 1
fi
grep -E "^trybox: |image debian-12-dev" "$dev_log" | tail -3 || true
rm -f "$dev_log"

stage "e2e tests"
(cd build && ctest --output-on-failure -L e2e -j "${TRYBOX_E2E_JOBS:-3}" --timeout 1500 "$@")

if [ "$asan" = "0" ]; then
  stage "unit tests"
  (cd build && ctest --output-on-failure -L unit "$@")
  stage "done"
  exit 0
fi

stage "clang: waiting for its build"
if ! wait "$asan_pid"; then
  tail -60 "$asan_log" >&2
  echo "clang build failed (its whole log: $asan_log)" >&2
  exit 1
fi
rm -f "$asan_log"
stage "unit tests (clang, ASan+UBSan)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
  ctest --output-on-failure -L unit "$@")

stage "fuzzers, two at a time"
# One fuzz target for TRYBOX_FUZZ_SECONDS in a directory of its own (the corpus it grows,
# its log, a crash's input); prints its figures, or its log's tail and where the input is.
fuzz() {
  local f=$1 work
  work=$(mktemp -d)
  mkdir "$work/corpus"
  if [ -d "fuzz/corpus/$f" ]; then cp -r "fuzz/corpus/$f/." "$work/corpus/"; fi
  if ! (cd "$work" && "$OLDPWD/build-asan/bin/$f" -max_total_time="${TRYBOX_FUZZ_SECONDS:-30}" \
        -print_final_stats=1 corpus >log 2>&1); then
    tail -40 "$work/log" >&2
    echo "fuzz: $f found a crash (the input is in $work)" >&2
    return 1
  fi
  echo "fuzz: $f for ${TRYBOX_FUZZ_SECONDS:-30} s:" \
    $(grep -E "^stat::(number_of_executed_units|new_units_added)" "$work/log" || true)
  rm -rf "$work"
}
failed=0
running=0
for f in "${fuzzers[@]}"; do
  if [ "$running" -ge 2 ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz "$f" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
if [ "$failed" != "0" ]; then exit 1; fi
stage "done"
