"""Golden records of every preset: the loss, its terms, the gradients' global norm and the
advantages on two fixed tiny batches, so a refactor of how methods are assembled can show it
changed no number (tests/unit/algos/test_golden_records.py checks them).

    .venv/bin/python -m tests.golden              # how far today's values are from the records
    .venv/bin/python -m tests.golden --write      # rewrites tests/data/golden_records.json
    .venv/bin/python -m tests.golden --write-new  # adds the presets without a record, only

Rewrite the records only in a commit that changes a preset on purpose, and say so in its message.
Inputs: the suite's tiny model (random parameters, key 0, std 0.1); two `make_turn_batch` batches
(seeds 0 and 1) with fixed teacher log-probs (the rollout's, for teacher_source="rollout") and
per-token distillation weights on their last three rows (read only by a weighted term, UCOB's);
the frozen initial policy and the EMA teacher are the parameters scaled by 1.03 and 1.05, the
teacher handed over (teacher_weights "frozen" / "old") the parameters themselves; iteration 3
(RLSD's λ). A turn-level preset's advantages are its rewrite of a fixed table of the batch's rows
(two turns an episode, two episodes a group, won where A > 0, the gaps lT − lold of the batch).
"""

from __future__ import annotations

import functools
import json
import os
import sys

import jax
import numpy as np
import optax

from sdar_jax import algos
from sdar_jax.algos import ALGO_PRESETS, TurnTable
from sdar_jax.core.loss import loss_and_grads
from sdar_jax.models import init_params
from tests.helpers import TINY_CONFIG, make_turn_batch

RECORDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "golden_records.json")
SEEDS = (0, 1)
ITERATION = 3


@functools.cache
def _inputs():
  params = init_params(TINY_CONFIG, jax.random.key(0), std=0.1)
  ref = jax.tree.map(lambda x: x * 1.03, params)
  ema = jax.tree.map(lambda x: x * 1.05, params)
  batches = []
  for seed in SEEDS:
    batch = make_turn_batch(params, seed=seed)
    rng = np.random.default_rng(100 + seed)
    teacher = np.asarray(batch.old_logp) + rng.normal(0.0, 0.5, batch.old_logp.shape)
    mask = np.asarray(batch.response_mask, np.float32)
    weight = np.zeros_like(mask)
    weight[-3:] = mask[-3:] * rng.choice([0.5, 1.0, 2.0, 4.0], size=mask[-3:].shape)
    batch = batch.replace(teacher_logp=teacher.astype(np.float32), distill_weight=weight)
    batches.append(batch)
  return params, ref, ema, batches


def _turn_table(batch) -> TurnTable:
  mask = np.asarray(batch.response_mask, np.float64)
  gap = (np.asarray(batch.teacher_logp, np.float64) - np.asarray(batch.old_logp)) * mask
  rows = np.arange(batch.batch_size)
  adv = np.asarray(batch.advantages, np.float64)
  return TurnTable(
    advantage=adv,
    gap_sum=gap.sum(1),
    gap_mean=gap.sum(1) / np.maximum(mask.sum(1), 1),
    group=rows // 4,
    episode=rows // 2,
    turn=rows % 2,
    won=(adv > 0).astype(np.float64),
  )


def _advantages(algo, batch) -> list[float]:
  if algo.turn_advantages:
    rewrite = jax.jit(lambda table: algos.TURN_ADVANTAGES.get(algo.advantage)(algo, table))
    return np.asarray(rewrite(_turn_table(batch)), np.float64).tolist()
  weight = algos.rlsd_lambda(ITERATION, algo.rlsd.lam0, algo.rlsd.warmdown_iterations)
  out = algos.token_advantages(
    algo.advantage,
    batch.advantages,
    batch.response_mask,
    teacher_logp=batch.teacher_logp,
    old_logp=batch.old_logp,
    teacher_weight=weight,
    clip_eps=algo.rlsd.clip_eps,
  )
  return np.asarray(out, np.float64).reshape(-1).tolist()


def compute() -> dict[str, list[dict]]:
  """{preset: [one record per batch]}, each {"loss", "terms", "grad_norm", "advantages"}: every
  preset's loss and gradients in one compiled program (the presets share the model's forward and
  backward passes, which XLA computes once: a third of the compile time of one program each), a
  loop over the two stacked batches."""
  params, ref, ema, batches = _inputs()
  names = sorted(ALGO_PRESETS)

  def one(batch):
    out = {}
    for name in names:
      algo = ALGO_PRESETS[name]
      grads, metrics = loss_and_grads(
        TINY_CONFIG,
        algo,
        params,
        batch,
        ref_params=ref if algo.needs_ref_params else None,
        iteration=ITERATION,
        ema_params=ema if algo.keeps_ema else None,
        teacher_params=params if algo.passes_teacher_params else None,
      )
      out[name] = (optax.global_norm(grads), metrics)
    return out

  stacked = jax.tree.map(lambda *xs: np.stack(xs), *batches)
  computed = jax.device_get(jax.jit(lambda b: jax.lax.map(one, b))(stacked))
  records = {}
  for name in names:
    norms, metrics_all = computed[name]
    records[name] = []
    for i, batch in enumerate(batches):
      metrics = jax.tree.map(lambda x: x[i], metrics_all)  # noqa: B023 (used at once)
      terms = {k: float(v) for k, v in sorted(metrics.items()) if np.ndim(v) == 0}
      records[name].append(
        {
          "loss": terms.pop("train/loss"),
          "terms": terms,
          "grad_norm": float(norms[i]),
          "advantages": _advantages(ALGO_PRESETS[name], batch),
        }
      )
  return records


def recorded() -> dict[str, list[dict]]:
  with open(RECORDS) as f:
    return json.load(f)


def flatten(records: dict[str, list[dict]]) -> dict[str, float]:
  """ "preset/batch/what" -> value, every number of the records."""
  flat = {}
  for name, per_batch in records.items():
    for b, rec in enumerate(per_batch):
      flat[f"{name}/{b}/loss"] = rec["loss"]
      flat[f"{name}/{b}/grad_norm"] = rec["grad_norm"]
      flat.update({f"{name}/{b}/terms/{k}": v for k, v in rec["terms"].items()})
      flat.update({f"{name}/{b}/advantages/{i}": v for i, v in enumerate(rec["advantages"])})
  return flat


def logp_scale() -> float:
  """The largest |log-prob| (the rollout's and the teacher's) on the batches' response tokens:
  the size of the per-token values every loss and term sums."""
  _, _, _, batches = _inputs()
  return max(
    float(np.max(np.abs(np.asarray(getattr(b, name))) * np.asarray(b.response_mask)))
    for b in batches
    for name in ("old_logp", "teacher_logp")
  )


def differences(got: dict, want: dict, rtol: float = 1e-6, summed: float = 0.0) -> list[str]:
  """What differs beyond `rtol` relative, each number against the larger of itself and its
  record's scale (the largest magnitude among that record's numbers of the same kind), so a term
  near 0 is held to float32 rounding of the quantities it is computed from; a loss or a term also
  against `summed`, the size of the per-token values it sums (`logp_scale`): another instruction
  set or XLA optimisation level rounds those differently by a few eps of their size."""
  g, w = flatten(got), flatten(want)
  out = [f"{k}: missing (recorded {w[k]:.9g})" for k in sorted(set(w) - set(g))]
  out += [f"{k}: new (not recorded)" for k in sorted(set(g) - set(w))]
  scales: dict[str, float] = {}
  for k, v in w.items():
    kind = k.rsplit("/", 1)[0] if "/advantages/" in k or "/terms/" in k else k
    scales[kind] = max(scales.get(kind, 0.0), abs(v))
  for k in sorted(set(g) & set(w)):
    kind = k.rsplit("/", 1)[0] if "/advantages/" in k or "/terms/" in k else k
    floor = summed if k.endswith("/loss") or "/terms/" in k else 0.0
    bound = rtol * max(abs(w[k]), scales[kind], floor, 1e-30)
    if not abs(g[k] - w[k]) <= bound:
      out.append(f"{k}: {g[k]:.9g}, recorded {w[k]:.9g}")
  return out


def main(argv: list[str]) -> int:
  got = compute()
  if "--write-new" in argv:
    records = recorded()
    new = sorted(set(got) - set(records))
    records.update({name: got[name] for name in new})
    with open(RECORDS, "w") as f:
      json.dump(records, f, indent=1, sort_keys=True)
      f.write("\n")
    print(f"added the records of {new or 'no preset'} to {RECORDS}")
    return 0
  if "--write" in argv:
    with open(RECORDS, "w") as f:
      json.dump(got, f, indent=1, sort_keys=True)
      f.write("\n")
    print(f"wrote {RECORDS} ({len(flatten(got))} numbers of {len(got)} presets)")
    return 0
  diff = differences(got, recorded(), summed=logp_scale())
  print("\n".join(diff) if diff else "all records equal")
  return 1 if diff else 0


if __name__ == "__main__":
  jax.config.update("jax_default_matmul_precision", "highest")  # the suite's (tests/conftest.py)
  sys.exit(main(sys.argv[1:]))
