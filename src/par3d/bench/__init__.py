"""Benchmarks behind `par3d bench <name>`: each module registers one sub-subcommand."""
