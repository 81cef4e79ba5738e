#!/usr/bin/env bash
# Debian's headless Chromium for the report's browser test (tests/test_report_browser.py).
# Idempotent: does nothing when chromium is already installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    echo "chromium: $(chromium --version 2>/dev/null | head -1)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q chromium
echo "chromium: $(chromium --version 2>/dev/null | head -1)"
