"""`gpuprov mig apply`: MIG layouts rolled across Kubernetes GPU nodes through the GPU Operator's MIG
manager, batch by batch, as a client of the rolling change engine (provisioner.rollout: cordon, GPU pods
evicted, change, verify, uncordon; state recorded, resumable)."""
