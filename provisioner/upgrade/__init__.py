"""`gpuprov upgrade-driver`: a rolling upgrade of the host-installed NVIDIA driver across a fleet, a client
of the rolling change engine (provisioner.rollout), which brings the waves, canaries, --max-fail, the
state file behind `--resume`, Ctrl-C and the node handling.

The modules, each importing only those above it:
- plan: the target (`DriverTarget`), what a host reports of its driver (`DriverProbe`), the plan, the
  judgement of an upgraded host and the dry-run text;
- rollout: the driver change's steps (`DRIVER`), options, the fleet it needs and a host's way through
  the upgrade (`DriverRollout`);
- adapters: the real fleet (SSH probes, ansible-runner with playbooks/upgrade_driver.yml);
- verb: `run_upgrade`, the verb: checks the input, plans, runs, and returns an `UpgradeResult`;
- render: how the CLI shows a plan and a result.
"""
