"""Histograms counted inside the compiled update: the teacher-student gap and the gate over an
update's response tokens, on fixed bins, as small integer vectors (never the [B, R] token arrays).
The host side (sums over mini-batches, files, plots) is `sdar_jax.observe.gate_histograms`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Fixed bins (float32, as the compiled update compares them): the gap from -8 to 4 by 0.1 (most of
# the gates.py range of real gaps, about [-10, 2], with room on the positive side, and fine where
# σ(βΔ) turns: 20 bins over [-1, 1]), the gate by 0.05.
GAP_EDGES = np.linspace(-8.0, 4.0, 121).astype(np.float32)
GATE_EDGES = np.linspace(0.0, 1.0, 21).astype(np.float32)
HISTOGRAM_EDGES: dict[str, np.ndarray] = {"gap": GAP_EDGES, "gate": GATE_EDGES}
METRIC_PREFIX = "diag/"  # update metrics holding histogram counts (arrays, not scalars)


def masked_histogram(values: jax.typing.ArrayLike, mask: jax.typing.ArrayLike, edges) -> Array:
  """Counts (int32, length len(edges) + 1) of the entries of `values` where `mask` > 0:
  [below edges[0], the len(edges) − 1 bins, above edges[-1]]. Bins are numpy.histogram's:
  [e_i, e_{i+1}) and the last one closed [e_{n-1}, e_n]; NaNs are in no count. Traceable, and
  additive over disjoint masks (micro-batches sum)."""
  edges = jnp.asarray(edges, jnp.float32)
  x = jnp.asarray(values, jnp.float32).reshape(-1, 1)
  keep = (jnp.asarray(mask) > 0).reshape(-1, 1)
  below_edge = jnp.sum(keep & (x < edges), axis=0, dtype=jnp.int32)  # [n+1]: #(x < e_k)
  at_most_last = jnp.sum(keep & (x <= edges[-1]), dtype=jnp.int32)
  above = jnp.sum(keep & (x > edges[-1]), dtype=jnp.int32)
  bins = jnp.concatenate(
    [below_edge[1:-1] - below_edge[:-2], (at_most_last - below_edge[-2])[None]]
  )
  return jnp.concatenate([below_edge[:1], bins, above[None]])


def update_histograms(gap: Array, gate: Array | None, mask: Array) -> dict[str, Array]:
  """The update's histogram metrics (`METRIC_PREFIX` keys) of one micro-batch."""
  out = {f"{METRIC_PREFIX}gap_counts": masked_histogram(gap, mask, GAP_EDGES)}
  if gate is not None:
    out[f"{METRIC_PREFIX}gate_counts"] = masked_histogram(gate, mask, GATE_EDGES)
  return out
