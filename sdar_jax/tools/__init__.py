"""Maintenance tools run with `python -m sdar_jax.tools.<name>` (e.g. building committed assets)."""
