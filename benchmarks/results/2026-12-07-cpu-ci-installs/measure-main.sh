#!/usr/bin/env bash
# pip vs uv: the main lock into a fresh venv, cold caches
set -euo pipefail
cd /work/main
lock=.ci/locks/main.txt
rm -rf /tmp/uvt/pipvenv /tmp/uvt/uvvenv /tmp/uvt/cache-*
python3 -m venv /tmp/uvt/pipvenv
export PIP_CACHE_DIR=/tmp/uvt/cache-pip
/usr/bin/time -f "pip main: %e s wall %U+%S cpu" bash -c "
/tmp/uvt/pipvenv/bin/python -m pip install -q --no-compile \$(grep -i '^pip==' $lock)
/tmp/uvt/pipvenv/bin/python -m pip install -q --no-compile --no-deps --no-build-isolation -r <(grep -viE '^(pip|deepspeed)==' $lock)
/tmp/uvt/pipvenv/bin/python -m pip install -q --no-compile --no-deps --no-build-isolation \$(grep -i '^deepspeed==' $lock)"
python3 -m venv /tmp/uvt/uvvenv
export UV_CACHE_DIR=/tmp/uvt/cache-uv
UV=/tmp/uvt/uvbin/bin/uv
/usr/bin/time -f "uv main: %e s wall %U+%S cpu" bash -c "
$UV pip install -q --python /tmp/uvt/uvvenv/bin/python --no-deps --find-links /opt/wheels --extra-index-url file:///opt/pypi/simple --extra-index-url file:///opt/pypi-more/simple --index-strategy unsafe-best-match \$(grep -i '^pip==' $lock)
$UV pip install -q --python /tmp/uvt/uvvenv/bin/python --no-deps --no-build-isolation --find-links /opt/wheels --extra-index-url file:///opt/pypi/simple --extra-index-url file:///opt/pypi-more/simple --index-strategy unsafe-best-match -r <(grep -viE '^(pip|deepspeed)==' $lock)
$UV pip install -q --python /tmp/uvt/uvvenv/bin/python --no-deps --no-build-isolation --find-links /opt/wheels --extra-index-url file:///opt/pypi/simple --extra-index-url file:///opt/pypi-more/simple --index-strategy unsafe-best-match \$(grep -i '^deepspeed==' $lock)"
/tmp/uvt/uvvenv/bin/python -m pip freeze --all | LC_ALL=C sort -f > /tmp/uvt/uv-freeze.txt
/tmp/uvt/pipvenv/bin/python -m pip freeze --all | LC_ALL=C sort -f > /tmp/uvt/pip-freeze.txt
diff /tmp/uvt/pip-freeze.txt /tmp/uvt/uv-freeze.txt && echo "same packages"
