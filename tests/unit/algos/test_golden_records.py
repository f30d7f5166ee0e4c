"""Every preset's golden record (tests/golden.py: the loss, its terms, the gradients' global norm
and the advantages on two fixed tiny batches) equals today's computation to 1e-6 relative (each
number against the larger of itself, its record's scale and, for a loss or a term, the size of the
log-probs it sums). A preset changed on purpose has its record rewritten
(`python -m tests.golden --write`) in the commit that changes it."""

from __future__ import annotations

import pytest

from sdar_jax.algos import ALGO_PRESETS
from tests import golden

RECORDS = golden.recorded()


@pytest.fixture(scope="module")
def computed():
  """Every preset's records today (one compiled program; the module stays on one xdist worker)."""
  return golden.compute()


def test_every_preset_has_a_record():
  assert sorted(RECORDS) == sorted(ALGO_PRESETS)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_golden_record(name, computed):
  diff = golden.differences(
    {name: computed[name]}, {name: RECORDS[name]}, summed=golden.logp_scale()
  )
  assert not diff, "\n".join(diff)
