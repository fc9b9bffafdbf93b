"""Rolling node changes: hosts changed wave by wave, each cordoned, drained, changed, verified and put
back, every step recorded so that `--resume` carries on after a crash or Ctrl-C.

The engine knows nodes, waves and the state file, never what the change is: `upgrade-driver`
(provisioner.upgrade) and `mig apply` (provisioner.migapply) are its clients, each subclassing `Rollout`
with its own host steps and naming its own change steps (`ChangeKind`).

The modules, each importing only those above it:
- plan: batch sizes, counts, `--limit` names, the run's `Target` and the wave plan;
- state: the run's state file (steps, results, `ChangeKind`), finding runs to resume, the inventory lock;
- model: what touches hosts, as two small interfaces (`Fleet`, `Kube`) and what they return;
- kube: the real `Kube`, kubectl on the first control-plane host over SSH;
- engine: the orchestration (`Rollout`), the run's summary and exit code;
- render: how the CLI shows a rolling run's progress and summary.
"""
