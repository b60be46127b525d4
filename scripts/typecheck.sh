#!/usr/bin/env bash
# Type-check cli/, agent/ and core/ as the package they install as (rtrain.*).
#
# setup.cfg maps the three folders into one package; mypy reads a package from a
# folder tree, so this builds that tree out of symlinks in a temporary folder (the
# checkout itself is left alone) and runs mypy over it with pyproject.toml's settings.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
mkdir "$view/rtrain"
ln -s "$root/rtrain_pkg/__init__.py" "$view/rtrain/__init__.py"
for layer in cli agent core; do ln -s "$root/$layer" "$view/rtrain/$layer"; done
cd "$view"
python3 -m mypy --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" -p rtrain
