# Sourced by the launchers: PY is the interpreter they run, $PYTHON if set, else the repository's
# .venv/bin/python if it exists, else python3 on PATH (e.g. a cluster venv with the project
# installed by `pip install -e .`). Fails with the fix when none is found.
if [[ -n "${PYTHON:-}" ]]; then
  PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then
  PY=.venv/bin/python
else
  PY=python3
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "$(basename "$0"): no Python interpreter '$PY'. Fix: set PYTHON=/path/to/python (with the" \
    "project installed), or run 'make test' once to build .venv." >&2
  exit 2
fi
