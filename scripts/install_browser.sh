#!/bin/sh
# `make e2e`'s browser: Debian's chromium and chromium-driver, from apt (never a browser download).
# Installs them when missing and this user may (root, or sudo without a password); otherwise says
# so and exits 0, and the end-to-end tests skip with the same advice.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "e2e: no chromium here and no root to install it: run 'sudo apt-get install chromium chromium-driver'"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "e2e: no apt-get here: install Chromium and its chromedriver with this system's package manager"
    exit 0
fi
echo "e2e: installing Debian's chromium and chromium-driver (about a minute)"
$as_root apt-get update -qq >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
    || echo "e2e: apt-get could not install chromium chromium-driver; the browser tests will be skipped"
exit 0
