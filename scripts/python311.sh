#!/usr/bin/env bash
# Prints the path of a Python 3.11 interpreter (the stack is pinned to 3.11).
set -euo pipefail
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    command -v "$candidate"; exit 0
  fi
done
echo "error: no Python 3.11 found (apt-get install -y python3.11 python3.11-venv)" >&2
exit 2
