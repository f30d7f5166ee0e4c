"""Host side of an iteration: multi-turn episodes -> turn-samples -> fixed-shape update batches."""

from sdar_jax.rollout.agent_loop import AgentLoop, EnvAdapter
from sdar_jax.rollout.batching import episodes_to_samples, pack_batch, plan_minibatches
from sdar_jax.rollout.replay import ReplayQueue
from sdar_jax.rollout.tasks import validation_tasks
from sdar_jax.rollout.trajectory import Episode, Turn

__all__ = [
  "AgentLoop",
  "EnvAdapter",
  "Episode",
  "ReplayQueue",
  "Turn",
  "episodes_to_samples",
  "pack_batch",
  "plan_minibatches",
  "validation_tasks",
]
