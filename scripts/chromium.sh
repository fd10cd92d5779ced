#!/usr/bin/env bash
# Provision Debian's Chromium and its WebDriver for the report's browser test (called by `make test`/`make chromium`).
#
# tests/integration/test_report_browser.py starts chromedriver and a headless Chromium itself (its own port, a
# fresh profile, no network use of its own); this script only makes sure both binaries exist. Nothing is started.
set -euo pipefail

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "chromium.sh: chromium and chromedriver are missing; install Debian's chromium and chromium-driver (needs root and apt)" >&2
    exit 1
fi
bash "$(dirname "$0")/apt-install.sh" chromium chromium-driver
command -v chromium >/dev/null && command -v chromedriver >/dev/null
