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
if [[ $# -gt 0 ]]; then
  set +e
  python -m pytest "$@"
  rc=$?
  set -e
  if [[ $rc -eq 5 ]]; then
    echo "test: pytest collected no tests: that is a failure" >&2
    exit 1
  fi
  exit $rc
fi

# The whole suite: the tests that need no lab run beside the lab tests, in a second pytest. The lab
# tests spend most of their time waiting on the lab's hosts (boots, kubelets, rollouts); the others
# use the CPU meanwhile. Each half must collect tests: no tests in either is a failure.
unit_log=$(mktemp)
python -m pytest -m "not lab" -p no:cacheprovider >"$unit_log" 2>&1 &
unit_pid=$!
# On the way out (also when interrupted) the second pytest goes too; under errexit a trap's failing
# command would become the script's exit status, so nothing in it may fail.
trap 'kill "$unit_pid" 2>/dev/null || true; rm -f "$unit_log" || true' EXIT
set +e
python -m pytest -m lab
lab_rc=$?
wait "$unit_pid"
unit_rc=$?
set -e
echo "== pytest: the tests that need no lab (run beside the lab tests)"
cat "$unit_log"
for half in "lab:$lab_rc" "no lab:$unit_rc"; do
  if [[ ${half##*:} -eq 5 ]]; then
    echo "test: pytest collected no tests (${half%:*}): that is a failure" >&2
    exit 1
  fi
done
if [[ $lab_rc -ne 0 ]]; then
  exit $lab_rc
fi
exit $unit_rc
