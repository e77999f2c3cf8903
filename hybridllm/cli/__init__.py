"""The `hybridllm` command line: `main` (the entry point and its commands), the demo, explain,
the router commands, and rich progress bars and tables."""
