"""`gpuprov bootstrap`: bare hosts → GPU Operator through the stage playbook (playbooks/site.yml, one tag
per chosen stage), then verification with the checks that prove the stages that ran. It runs as every
playbook verb does (provisioner.playbookverb); what is its own is here, in verb: the stages chosen by
--only/--skip, the progress they show, and --retry-failed.
"""
