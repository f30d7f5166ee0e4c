"""sdar-jax: Self-Distilled Agentic Reinforcement Learning (SDAR) in JAX/Flax."""

__version__ = "0.1.0"
