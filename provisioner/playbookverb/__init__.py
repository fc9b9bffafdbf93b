"""The verbs that run a playbook over the inventory, then verify what it set: `bootstrap` (the stages of
playbooks/site.yml; provisioner.bootstrap) and the day-2 verbs `sharing apply` and `tenants apply` (one
part of a stage through its own playbook; day2).

Order of work, the same for each: inventory and settings validated (bad input: exit 2, no host touched)
→ confirmation → the playbook through ansible-runner → progress from runner events as they happen → a
run record (events, stats, summary) → verification of the hosts that came through, limited to the
checks that prove what ran.

- run: the shared run (`run`, returning a VerbResult; it prints nothing), and what verification expects;
- day2: the day-2 verbs (`DAY2`, `run_day2`);
- render: how the CLI shows a run: live progress (a per-host table in a terminal, plain lines
  otherwise), the summary table or JSON, and in check mode what would change, task by task, with diffs.
"""
