"""`gpuprov upgrade-driver`: a rolling upgrade of the host-installed NVIDIA driver across a fleet.

Per host: probe (skip when already at the target) → cordon → drain (or evict GPU pods) → pause the GPU
Operator's operands → stop GPU services and unload the modules → unhold, install, hold (the
nvidia_driver role, the same code bootstrap runs) → reload the modules, or reboot when that is
impossible and allowed → verify → restore the operands → uncordon. Canaries first, then batches of
hosts in parallel; no new batch starts once failures exceed --max-fail. Every step is recorded in the
run's state file, so `--resume` carries on after a crash or Ctrl-C.

The modules, each importing only those above it:
- plan: the target (`DriverTarget`), batch sizes, per-host probes (`HostProbe`) and the wave plan;
- state: the run's state file and the inventory lock (what `--resume` reads);
- model: what touches hosts, as two small interfaces (`Fleet`, `Kube`) and their results;
- rollout: the orchestration (`Rollout`), tested against a fake fleet;
- adapters: the real fleet (SSH, kubectl on the control plane, ansible-runner);
- verb: `run_upgrade`, the verb: checks the input, plans, runs, and returns an `UpgradeResult`;
- render: how the CLI shows progress, a plan and a result.
"""
