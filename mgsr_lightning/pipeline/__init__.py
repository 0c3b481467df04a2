"""Multi-step jobs built on the CLI: preparing the embedded default, the demo, and ``reproduce``."""
