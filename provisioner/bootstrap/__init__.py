"""`gpuprov bootstrap`: bare hosts → GPU Operator through the stage playbook, then verification.

Order of work: inventory and settings validated (bad input: exit 2, no host touched) → confirmation →
playbooks/site.yml through ansible-runner with one tag per chosen stage → progress from runner events as
they happen → a run record (events, stats, summary) → verification of the hosts that came through,
limited to the checks that prove the stages that ran.

- verb: `run_bootstrap`, the library side: returns a BootstrapResult and prints nothing;
- render: how the CLI shows it: live progress (a per-host table in a terminal, plain lines otherwise),
  the summary table or JSON, and in check mode what would change, task by task, with the diffs.
"""
