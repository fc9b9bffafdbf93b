"""The decision half of a health loop: from a host's evidence (Xids of this boot, the driver's recovery
action, row remapping, uncorrectable ECC, GPUs the driver lost) to what an operator should do with it.
`gpuprov remediate --dry-run` prints the plan; acting on it is not part of this version."""
