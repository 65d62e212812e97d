#!/usr/bin/env bash
# Installs tryboxd as a systemd user service for the current user and starts it:
#   scripts/install-service.sh [BINDIR]     (default: build/bin of this checkout)
#   scripts/install-service.sh --uninstall
# Without the service, the trybox CLI starts tryboxd on demand; both use the same socket,
# so a daemon started on demand is stopped first (its VMs are destroyed).
set -euo pipefail
cd "$(dirname "$0")/.."
unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
unit="$unit_dir/tryboxd.service"

if [[ "${1:-}" == "--uninstall" ]]; then
  systemctl --user disable --now tryboxd.service 2>/dev/null || true
  rm -f "$unit"
  systemctl --user daemon-reload
  echo "removed $unit; the trybox CLI starts tryboxd on demand again"
  exit 0
fi

bindir="$(realpath "${1:-build/bin}")"
for b in trybox tryboxd; do
  [[ -x "$bindir/$b" ]] || { echo "no $bindir/$b: build first (scripts/build.sh)" >&2; exit 1; }
done
if ! systemctl --user show-environment >/dev/null 2>&1; then
  echo "no systemd user manager for $(id -un) (try: loginctl enable-linger $(id -un))" >&2
  exit 1
fi
mkdir -p "$unit_dir"
sed -e "s|@BINDIR@|$bindir|g" -e "s|@DOCDIR@|$PWD/docs|g" packaging/systemd/tryboxd.service \
  >"$unit.tmp"
mv "$unit.tmp" "$unit"
# A daemon the CLI started holds the socket's lock: stop it so the service's can start.
"$bindir/trybox" daemon stop >/dev/null 2>&1 || true
systemctl --user daemon-reload
systemctl --user enable --now tryboxd.service
echo "installed $unit (tryboxd from $bindir) and started it"
"$bindir/trybox" daemon status || true
