"""A training step's diagnostics, read from whatever names its backend reports them under, into the step's typed
columns (loss, entropy, kl, grad_norm, clip_fraction), which the curves and the alert rules read.

Backends name them differently: the embedded backend ``kl``; the transformers backend ``kl_policy_ref``, as ART's
loss does; ART's own backends (local, serverless) either the bare name or ART's namespaced one (``loss/kl_policy_ref``,
``loss/train``: ``_UPSTREAM_TRAIN_METRIC_KEYS`` in art/unsloth/train.py). A column left empty where a backend did
measure it is a curve saying "not reported" and an alert that can never fire, so every spelling lands here. The raw
metrics are kept as they came, in the step's metrics JSON.
"""

from __future__ import annotations

from collections.abc import Mapping

# Each typed column, and the names it is reported under, in order of preference (KL to the reference before the KL
# to the sampling policy: the KL-spike alert watches the policy's drift from where it started).
COLUMN_NAMES: dict[str, tuple[str, ...]] = {
    "loss": ("loss", "loss/train", "policy_loss"),
    "entropy": ("entropy", "loss/entropy"),
    "kl": ("kl", "kl_policy_ref", "loss/kl_policy_ref", "kl_div", "loss/kl_div"),
    "grad_norm": ("grad_norm", "loss/grad_norm"),
    "clip_fraction": ("clip_fraction", "loss/clip_fraction"),
}


def typed_diagnostics(reported: Mapping[str, float]) -> dict[str, float | None]:
    """Each typed column's value: the first of its names that was reported, else None."""
    return {column: _first(reported, names) for column, names in COLUMN_NAMES.items()}


def _first(reported: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        value = reported.get(name)
        if isinstance(value, (int, float)):
            return float(value)
    return None
