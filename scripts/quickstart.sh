#!/usr/bin/env bash
# Quick start on a fresh machine: set up, bring up the local lab fleet (4 hosts: the control plane and
# one GPU host per containerd generation) and bootstrap it through every stage, ending with the
# verification table.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
gpuprov lab up --hosts "${GPUPROV_LAB_HOSTS:-4}"
inventory=$(gpuprov lab inventory | tail -n 1)
gpuprov bootstrap -i "$inventory" --yes
