#!/usr/bin/env bash
# Makes sure a Prometheus server binary is available for the integration tests.
# Installs Debian's `prometheus` package when missing and running as root; otherwise explains how.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 || [ -n "${PROMETHEUS_BIN:-}" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "prometheus not found: installing Debian package 'prometheus'" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # The package may start a system service on a fixed port; the tests start their own.
    if command -v service >/dev/null 2>&1; then service prometheus stop >/dev/null 2>&1 || true; fi
    command -v prometheus >/dev/null 2>&1 && exit 0
fi
cat >&2 <<'MSG'
error: no Prometheus server binary found.
  The Prometheus-path tests start a real server on a loopback port. Install one:
    sudo apt-get install prometheus        (Debian/Ubuntu)
  or point PROMETHEUS_BIN at a prometheus binary (2.x or newer).
MSG
exit 1
