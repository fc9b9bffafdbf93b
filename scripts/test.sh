#!/usr/bin/env bash
# The whole test suite: lint (ruff, ansible-lint production profile, playbook syntax) and pytest
# (unit, lab end-to-end, molecule). Sets up what it needs first. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# Lab tests must run here, never skip quietly because an engine is missing.
export GPUPROV_REQUIRE_LAB=${GPUPROV_REQUIRE_LAB:-1}
export ANSIBLE_ROLES_PATH="$PWD/roles"

echo "== ruff"
ruff check .
echo "== ansible-lint (production profile, offline)"
ansible-lint --offline --profile production playbooks/ roles/
echo "== ansible-playbook --syntax-check"
for pb in playbooks/*.yml; do
  ansible-playbook --syntax-check -i inventory/sample/hosts.yml "$pb" >/dev/null
done
echo "== pytest"
set +e
python -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "test: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit $rc
