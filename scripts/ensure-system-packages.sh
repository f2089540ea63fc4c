#!/usr/bin/env bash
# Installs the Debian packages streamproof needs, only those missing, with one `apt-get update` first.
# Idempotent: on a machine that has everything it prints nothing and touches nothing.
set -euo pipefail

missing=()
have() { command -v "$1" >/dev/null 2>&1; }

java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! have java || [ "$(java_major)" -lt 17 ]; then missing+=(openjdk-17-jdk-headless); fi
have mvn || missing+=(maven)
[ -x /usr/lib/postgresql/15/bin/postgres ] || missing+=(postgresql-15)
have kcat || missing+=(kcat)  # the tests' independent read_committed check of a Kafka sink
have promtool || missing+=(prometheus)  # ops/prometheus: promtool tests the alerts, a real server fires one
if ! have python3.11 && ! python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  missing+=(python3.11 python3.11-venv)
fi
# A python3.11 without ensurepip cannot create the virtualenv (Debian splits venv out).
if have python3.11 && ! python3.11 -c 'import ensurepip' 2>/dev/null; then missing+=(python3.11-venv); fi

if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "error: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
  exit 2
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# No service is started by the install (Prometheus's, PostgreSQL's): streamproof starts its own, on its own ports.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && trap 'rm -f "$policy"' EXIT; fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
