"""The embedded benchmarks' generators: the tiny instruction task, the multi-step reasoning task and the
knowledge task, each written as train/validation/test JSONL."""
