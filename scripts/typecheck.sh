#!/usr/bin/env bash
# Type-check the rtrain package (rtrain/: cli, agent, core and the worker API's surface)
# with pyproject.toml's settings.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python3 -m mypy --config-file pyproject.toml --cache-dir .mypy_cache -p rtrain
