#!/usr/bin/env bash
# System packages the test servers need. Installs only what is missing.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  # The Debian package starts a system instance; the tests start their own on free ports.
  ($SUDO systemctl stop redis-server 2>/dev/null || $SUDO service redis-server stop 2>/dev/null) || true
fi
