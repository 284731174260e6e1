"""A step's diagnostics reach its typed columns under every name a backend reports them by, ART's own included."""

from __future__ import annotations

import pytest
from art.serverless.backend import _UPSTREAM_TRAIN_METRIC_KEYS as ART_METRIC_NAMES

from service.training.diagnostics import COLUMN_NAMES, typed_diagnostics

ART_COLUMNS = {"loss": "loss", "policy_loss": "loss", "entropy": "entropy", "kl_policy_ref": "kl", "kl_div": "kl",
               "grad_norm": "grad_norm"}  # fmt: skip


@pytest.mark.parametrize("bare", sorted(ART_COLUMNS))
def test_arts_bare_and_namespaced_names_land_in_their_column(bare):
    """ART's backends report ``kl_policy_ref`` or, through its serverless client, ``loss/kl_policy_ref``."""
    for name in (bare, ART_METRIC_NAMES[bare]):
        assert typed_diagnostics({name: 0.25})[ART_COLUMNS[bare]] == 0.25, name


def test_the_kl_to_the_reference_is_preferred_and_unreported_columns_stay_empty():
    typed = typed_diagnostics({"kl_div": 0.9, "loss/kl_policy_ref": 0.1, "trainable_groups": 3.0})
    assert typed == {"loss": None, "entropy": None, "kl": 0.1, "grad_norm": None, "clip_fraction": None}
    assert set(typed) == set(COLUMN_NAMES)
