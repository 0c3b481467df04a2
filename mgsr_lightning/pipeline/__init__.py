"""Multi-step jobs built on the CLI: preparing the embedded default or your own data, the demo, evaluation
and its tables, and ``reproduce``."""
