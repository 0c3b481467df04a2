"""The pieces around the LightningModule's training step: what a step learns from, its rollouts, its
optimiser, its callbacks, its checkpoints' extra state and its sharding.

- :mod:`.regimes`: the data regimes (ground truth, on-policy, mixed, adaptive off-policy, teacher-generated).
- :mod:`.rollout`: fresh student responses, revised by SCRG when it is on; :mod:`.minillm_rollout`: MiniLLM's.
- :mod:`.seqkd_cache`: SeqKD's teacher responses on disk.
- :mod:`.optim`: AdamW and its schedule; :mod:`.strategies`: FSDP from YAML.
- :mod:`.callbacks`, :mod:`.guards`, :mod:`.resume`: the module's callbacks, the non-finite-loss guard, and
  what a checkpoint holds besides weights.
- :mod:`.warning_format`: the package's warnings printed with their class names.
"""
