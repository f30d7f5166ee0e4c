"""Host-side text environments (pure Python, no JAX): the TextEnv contract, the registry, EnvPool.

    import envs
    env = envs.make("alfworld", data_dir="/data/alfworld", split="train", seed=0)
    with envs.EnvPool("alfworld", num_envs=16, env_kwargs={...}) as pool:
        results = pool.reset(tasks=[7] * 8 + [3] * 8)        # two GRPO groups of 8
        results = pool.step(["go to fridge 1"] * 16)

Environments live in subpackages (`envs.alfworld`, ...) that register themselves on import;
`envs.make(name)` imports `envs.<name>` on first use.
"""

from envs.base import (
  EnvAdapter,
  EnvFamily,
  EnvSplit,
  EpisodeView,
  StepResult,
  TextEnv,
  env_family,
  env_section_problems,
  failed_result,
  families_among,
  make,
  play_walkthroughs,
  register,
  register_family,
  registered_names,
)
from envs.pool import EnvPool

__all__ = [
  "EnvAdapter",
  "EnvFamily",
  "EnvPool",
  "EnvSplit",
  "EpisodeView",
  "StepResult",
  "TextEnv",
  "env_family",
  "env_section_problems",
  "failed_result",
  "families_among",
  "make",
  "play_walkthroughs",
  "register",
  "register_family",
  "registered_names",
]
