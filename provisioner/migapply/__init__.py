"""`gpuprov mig apply`: MIG layouts rolled across Kubernetes GPU nodes through the GPU Operator's MIG
manager, batch by batch, with the driver upgrade's rollout (cordon, GPU pods evicted, change, verify,
uncordon; state recorded, resumable)."""
