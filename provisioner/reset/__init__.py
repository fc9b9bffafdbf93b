"""`gpuprov reset`: take hosts back, stage by stage in reverse, from each host's ledger."""
