#!/usr/bin/env bash
# A quick pass of the benchmarks (a few minutes at most), each headline figure printed beside
# the last recorded one in bench/baseline.json; figures more than 1.5x worse are marked
# WORSE. Timings are not tests: this never fails because of a figure.
#
#   scripts/bench.sh                          run and compare
#   scripts/bench.sh --record "why"           run, compare, and make these figures the baseline
#   scripts/bench.sh --only lifecycle         one bench (lifecycle, template, workspace)
#
# Needs a build (scripts/build.sh) and a built image (as the e2e tests: TRYBOX_IMAGES or the
# default image directory). A change that moves a figure quotes this output in its note;
# the baseline moves only with --record and a reason, which is kept inside it.
set -uo pipefail
cd "$(dirname "$0")/.."
record=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --record) record="${2:?--record needs a reason}"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "usage: scripts/bench.sh [--record REASON] [--only lifecycle|template|workspace]" >&2
       exit 2 ;;
  esac
done
bin=build/bin
for b in lifecycle_bench template_bench workspace_bench bench_compare; do
  if [ ! -x "$bin/$b" ]; then
    echo "bench.sh: $bin/$b is missing; run scripts/build.sh" >&2
    exit 2
  fi
done
# template_bench compares `run -- true` with Anthropic's `srt` process sandbox when it is on
# PATH: a pinned version from npm, into build/srt, once (no npm, no network: no comparison).
srt_version=0.0.83
if ! command -v srt >/dev/null 2>&1; then
  if [ ! -x build/srt/node_modules/.bin/srt ] && command -v npm >/dev/null 2>&1; then
    npm install --silent --no-audit --no-fund --prefix build/srt \
      "@anthropic-ai/sandbox-runtime@$srt_version" >/dev/null 2>&1 ||
      echo "bench.sh: could not install srt from npm; template_bench runs without it" >&2
  fi
  if [ -x build/srt/node_modules/.bin/srt ]; then PATH="$PWD/build/srt/node_modules/.bin:$PATH"; fi
fi
out=$(mktemp -d /tmp/tbx-bench-XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "== load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores; $(git log -1 --format='%h %s' | cut -c1-70)"
files=()
run() {
  local name=$1
  shift
  [ -n "$only" ] && [ "$only" != "$name" ] && return
  echo "== $name"
  local start=$SECONDS
  if "$bin/${name}_bench" "$@" --figures "$out/$name.json"; then
    files+=("$out/$name.json")
  else
    echo "bench.sh: ${name}_bench failed; its figures are left out" >&2
  fi
  echo "   ($((SECONDS - start)) s)"
}
run lifecycle --quick
run template --quick
run workspace --quick
echo "== compared with bench/baseline.json"
if [ ${#files[@]} -eq 0 ]; then
  echo "bench.sh: no figures" >&2
  exit 0
fi
if [ -n "$record" ]; then
  "$bin/bench_compare" --baseline bench/baseline.json --record --reason "$record" "${files[@]}"
else
  "$bin/bench_compare" --baseline bench/baseline.json "${files[@]}" || true
fi
exit 0
