"""The command line: LightningCLI and what it reads before any model loads.

- :mod:`.lightning_cli`: ``DistillCLI`` and ``run_cli`` (``python -m mgsr_lightning fit|validate|test|predict``).
- :mod:`.config_files`: YAML with ``_base_`` composition and OmegaConf interpolation.
- :mod:`.validation`: checks of a run's configuration, each a one-line error.
- :mod:`.run_lock`: one ``fit`` at a time per export folder.
"""
