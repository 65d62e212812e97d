#!/usr/bin/env bash
# The one command for a new machine: install what is missing, build, build the default
# image, and run a command in a microVM.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/bin/trybox image build debian-12
build/bin/trybox doctor
build/bin/trybox run -- uname -a
