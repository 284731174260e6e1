"""bench/roofline.py's FLOP and byte arithmetic on a toy model (the benchmark itself is run by hand)."""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location("roofline", Path(__file__).resolve().parents[1] / "bench" / "roofline.py")
roofline = importlib.util.module_from_spec(spec)
sys.modules["roofline"] = roofline  # dataclasses look their module up
spec.loader.exec_module(roofline)


def test_training_and_sampling_counts_on_a_toy_model():
    s = roofline.Shapes(layers=2, hidden=4, kv_dim=2, body_params=100, head_params=10, lora_params=1, bytes_per_param=4)
    row = roofline.train_row_flops(s, 3)  # 3 positions, 9 attention pairs
    assert row["policy_forward"] == 2 * 101 * 3 + 2 * 10 * 3 + 4 * 2 * 4 * 9
    assert row["reference_forward"] == 2 * 100 * 3 + 2 * 10 * 3 + 4 * 2 * 4 * 9
    assert row["recompute"] == 2 * 101 * 3  # the products only: the attention's outputs are kept
    assert row["backward"] == 2 * 101 * 3 + 2 * 1 * 3 + 2 * 10 * 3 + 8 * 2 * 4 * 9
    flops, nbytes = roofline.sampling_call(s, rows=5, new=1, cached=7, logits=5)  # one decode step of 5 rows
    assert flops == 2 * 101 * 5 + 2 * 10 * 5 + 4 * 2 * 4 * 5 * 8
    assert nbytes == 111 * 4 + 2 * 2 * 2 * 4 * 5 * 7  # the weights once, K and V of every layer and cached row
    assert roofline.roofline(2e9, 1e9, gflops=1.0, gbs=2.0) == 2.5


def test_a_training_rows_head_is_counted_where_the_loss_reads_it():
    s = roofline.Shapes(layers=2, hidden=4, kv_dim=2, body_params=100, head_params=10, lora_params=1, bytes_per_param=4)
    full, read = roofline.train_row_flops(s, 3), roofline.train_row_flops(s, 3, logits=1)
    assert full["policy_forward"] - read["policy_forward"] == 2 * 10 * 2 == full["backward"] - read["backward"]
    assert full["recompute"] == read["recompute"]  # the layers only
