#!/usr/bin/env bash
# Runs the whole test suite: unit tests, then end-to-end tests that boot real guests.
# Installs missing packages, builds, and (re)builds the default image first; the image's
# root filesystem is cached, so a rebuild after the first takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/bin/trybox image build debian-12
cd build
ctest --output-on-failure --timeout 1500 "$@"
