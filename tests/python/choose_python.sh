# tests/python/choose_python.sh — sourced by the Python test scripts: sets base_python, the interpreter that builds the wheel and makes every venv (one Python version for all, as the wheel is tagged with it).
#
# Debian's python3-torch (tools/install_deps.sh) lives in the system interpreter's site-packages,
# so /usr/bin/python3 is chosen where it has torch; elsewhere, any python3.
base_python=python3
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  base_python=/usr/bin/python3
fi
