#!/usr/bin/env bash
# Debian's Chromium and chromedriver, for the playground's browser tests (tests/test_playground.py).
# Does nothing when both are installed; otherwise installs the two Debian packages (as root, or through sudo).
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo)
fi
packages=(chromium chromium-driver)
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get install -y --no-install-recommends "${packages[@]}" \
    || { "${as_root[@]}" apt-get update && "${as_root[@]}" apt-get install -y --no-install-recommends "${packages[@]}"; }
