"""What a training iteration carries from phase to phase, and what a method's hooks see of it
(`sdar_jax.algos.hooks.IterationView`): the iteration's episodes, turn-samples, mini-batches and
metrics, and the few operations a hook may ask of the trainer. The phases themselves are
`Trainer.train_iteration`'s; this module holds no method's logic and names none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from sdar_jax.core.batch import TurnSample
from sdar_jax.core.sampling import SamplingParams
from sdar_jax.infra import multihost, paths
from sdar_jax.observe.metrics import mean_over_updates
from sdar_jax.observe.perf import IterationClock
from sdar_jax.rollout.global_batches import global_minibatches
from sdar_jax.rollout.turn_advantages import apply_turn_advantages

PHASES = ("rollout", "teacher_context", "batches", "teacher_scoring", "advantages", "update")


@dataclasses.dataclass
class RunView:
  """What hooks see outside an iteration (at an evaluation, at its end, on restore): the trainer's
  algorithm and the completed iterations (an `algos.IterationView` without samples or batches).
  `metrics` is the caller's dict: the hooks' metrics are merged into it."""

  trainer: Any
  iteration: int
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  samples: list = dataclasses.field(default_factory=list)

  @property
  def algo(self):
    return self.trainer.step_fn.algo_config

  @property
  def tokenizer(self):
    return self.trainer.tokenizer

  def hooks(self, point: str, *args) -> None:
    """Calls every hook of the run at `point`, merging the metrics they return into `metrics`."""
    for hooks in self.trainer.hooks.values():
      self.metrics.update(getattr(hooks, point)(self, *args) or {})

  # ------------------------------------------------------------------ what hooks may ask
  def rewrite_advantages(self, fn: Callable[..., Any]) -> dict[str, float]:
    raise RuntimeError("advantages can be rewritten only inside an iteration (after_* hooks)")

  def updates_applied(self) -> bool:
    return False

  def move_teacher_ema(self) -> None:
    t = self.trainer
    with t.device_turn():
      t.state = t.step_fn.move_teacher_ema(t.state)
      jax.block_until_ready(t.state.ema_params)

  def set_algo(self, algo) -> None:
    self.trainer.set_algo(algo)

  def set_rollout_retriever(self, retriever) -> None:
    loop = self.trainer.loop
    if loop is None or loop.retriever is None:
      raise RuntimeError("the training rollout has no skill retriever to replace (env.skills)")
    loop.retriever = retriever

  def save_text(self, name: str, text: str) -> None:
    """Writes `text` to the workdir's file `name` (the primary process only)."""
    if paths.is_primary_process():
      paths.write_text(paths.join(self.trainer.workdir, name), text)


@dataclasses.dataclass
class Iteration(RunView):
  """One training iteration in progress: `iteration` is its 0-based index; what it carries from
  phase to phase, and the advantages and updates a hook may ask about."""

  clock: IterationClock = dataclasses.field(default_factory=IterationClock)
  episodes: list = dataclasses.field(default_factory=list)
  batches: list = dataclasses.field(default_factory=list)
  per_batch: list = dataclasses.field(default_factory=list)  # (update metrics, its token count)
  rollout_seconds: float = 0.0
  seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # per phase

  @contextlib.contextmanager
  def phase(self, name: str) -> Iterator[None]:
    """Times a phase (one of `PHASES`, in that order) into perf/phase_<name>_seconds."""
    if name not in PHASES:
      raise ValueError(f"phase {name!r}: not one of {PHASES}")
    start = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

  def phase_metrics(self) -> dict[str, float]:
    return {f"perf/phase_{name}_seconds": s for name, s in self.seconds.items()}

  def rewrite_advantages(self, fn: Callable[..., Any]) -> dict[str, float]:
    t = self.trainer
    self.batches, metrics = apply_turn_advantages(
      fn, self.batches, self.samples, t.with_teacher, t.config.train.minibatch_order
    )
    return metrics

  def updates_applied(self) -> bool:
    return any(float(m.get("train/skipped_update", 0.0)) == 0.0 for m, _ in self.per_batch)

  def generate(self, conversations: list, max_new_tokens: int, temperature: float) -> list:
    """The policy's continuations of chat `conversations` at the current params, one batched call
    of the in-process sampler (each prompt left-cut to rollout.max_prompt_len; its own key, a
    function of the seed and the iteration): per conversation (prompt ids, response ids,
    log-probs, text)."""
    t = self.trainer
    if not conversations:
      return []
    limit = t.sampler.max_prompt_len
    prompts = [t.tokenizer.encode(t.chat_template.render(c))[-limit:] for c in conversations]
    sampling = SamplingParams(
      max_new_tokens=int(max_new_tokens),
      temperature=float(temperature),
      stop_token_ids=t.tokenizer.eos_token_ids,
    )
    key = jax.random.fold_in(jax.random.fold_in(t.rng, self.iteration), 7)
    with t.device_turn():
      out = t.sampler.generate(t.state.params, prompts, sampling, key)
    texts = t.tokenizer.decode_batch(out.tokens, skip_special_tokens=True)
    return list(zip(prompts, out.tokens, out.logprobs, texts))

  def update_on(
    self,
    rows: list,
    prefix: str,
    mini_batch_size: int | None = None,
    recompute_old_logp: bool = False,
  ) -> dict[str, float]:
    """One more pass of the compiled update over `rows` (dicts: prompt_ids, response_ids,
    logprobs, advantage; each its own group, no teacher context, so out of the distillation
    term), packed into mini-batches as the iteration's (of `mini_batch_size` rows, default
    train.mini_batch_size, each one optimizer step; padded with empty rows to a multiple of
    train.micro_batch_size), the teacher scored on them as on the iteration's; with
    `recompute_old_logp` (or algo.recompute_old_logp) θ_old re-scored at the current weights for
    all of them before the first step. The updates' token-weighted mean metrics, train/x as
    `prefix`/x."""
    t = self.trainer
    algo = t.step_fn.algo_config
    samples = [
      TurnSample(
        prompt_ids=list(r["prompt_ids"]),
        response_ids=list(r["response_ids"]),
        logprobs=list(r["logprobs"]),
        score=float(r.get("score", 0.0)),
        advantage=float(r["advantage"]),
        group_id=-1 - k,
        policy_version=self.iteration,
        valid=True,
        teacher_prompt_ids=list(r["prompt_ids"]),
        context=False,
      )
      for k, r in enumerate(rows)
    ]
    cfg = t.config.train
    size = int(mini_batch_size or cfg.mini_batch_size)
    micro = t.step_fn.micro_batch_size or size
    batches = global_minibatches(
      t.step_fn, samples, size, t.with_teacher, t.pad_id, order=cfg.minibatch_order,
      distill_weights=algo.reads_distill_weight, rows=-(-size // micro) * micro,
    )  # fmt: skip
    if algo.recompute_old_logp or recompute_old_logp:
      batches = [t.step_fn.recompute_old_logp(t.state.params, b)[0] for b in batches]
    if t.with_teacher and algo.teacher_source == "rollout":
      with t.device_turn():
        teacher = t.teacher_weights()
        batches = [b.replace(teacher_logp=t.step_fn.score_teacher(teacher, b)) for b in batches]
    teacher_params = t._update_teacher_params()
    per = []
    for b in batches:
      with t.device_turn():
        t.state, m = t.step_fn(
          t.state, b, t.ref_params, iteration=self.iteration + 1, teacher_params=teacher_params
        )
        m = {k: v for k, v in jax.device_get(m).items() if np.ndim(v) == 0}  # no histograms
        per.append((m, multihost.total(b.response_mask)))
    return {
      f"{prefix}/{k.split('/', 1)[1]}": v
      for k, v in mean_over_updates(per).items()
      if k.startswith("train/")
    }
