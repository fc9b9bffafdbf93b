#!/usr/bin/env bash
# Set up this machine for gpuprov: apt packages, the Python venv (.venv) with gpuprov and its lab installed.
# Idempotent: a second run only checks. Needs root (apt); Debian 12 or Ubuntu 22.04/24.04.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(docker.io debootstrap dpkg-dev apt-utils gnupg openssh-client openssh-server iptables
              python3-venv ca-certificates curl)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian's openssh-server would start a system sshd where systemd runs; the lab does not need one.

PY=${PYTHON:-python3}
stamp=.venv/.gpuprov-installed
want=$(cat pyproject.toml setup.py lab/pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi
if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup: installing gpuprov, its lab and their dependencies into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  # The product and, as a distribution of its own, the lab (which adds `gpuprov lab`).
  .venv/bin/python -m pip install -q -e '.[dev]' -e ./lab
  echo "$want" > "$stamp"
fi
echo "setup: ready (.venv/bin/gpuprov)"
