"""Best-of-N selection and pass@k as measurement instruments: exact numbers, total tie-breaks, equal hashes."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.evaluation.selection import Candidate, SelectionReport, mean_pass_at_k, pass_at_k, select, select_best

NAN = float("nan")


def closed_form(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# --- pass@k -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (5, 5, 5, 1.0),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 8, 3, 1.0),  # n - c = 2 < k: every 3-subset holds a correct sample
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_constructed_cases(n, c, k, expected):
    assert math.isclose(pass_at_k(n, c, k), expected, rel_tol=1e-12, abs_tol=0.0)
    assert math.isclose(pass_at_k(n, c, k), closed_form(n, c, k), rel_tol=1e-12, abs_tol=0.0)


def test_pass_at_k_is_stable_where_the_binomials_are_huge():
    # C(1000, 500) overflows a float; the product form does not need it
    assert math.isclose(pass_at_k(1000, 1, 500), 0.5, rel_tol=1e-9)
    assert 0.0 < pass_at_k(2000, 3, 10) < 1.0


nck = st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n)))


@given(nck)
def test_pass_at_k_matches_the_closed_form(args):
    n, c, k = args
    assert math.isclose(pass_at_k(n, c, k), closed_form(n, c, k), rel_tol=1e-9)


@given(nck)
def test_pass_at_1_is_the_share_correct(args):
    n, c, _ = args
    assert math.isclose(pass_at_k(n, c, 1), c / n, rel_tol=1e-9)


@given(nck)
def test_pass_at_k_is_monotone_in_k_and_in_c(args):
    n, c, k = args
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value


@pytest.mark.parametrize(("n", "c", "k"), [(5, 1, 0), (5, 1, -1), (5, 1, 6), (5, -1, 1), (5, 6, 1), (0, 0, 1)])
def test_pass_at_k_refuses_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    assert math.isclose(mean_pass_at_k([(4, 1), (4, 1), (4, 0)], 2), 1 / 3, rel_tol=1e-12)
    assert mean_pass_at_k([(10, 3)], 1) == pass_at_k(10, 3, 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)
    with pytest.raises(ValueError):
        mean_pass_at_k([(4, 1), (2, 1)], 3)  # k > n for the second example


# --- select_best tie-breaks ---------------------------------------------------------------------------------


def cand(index, completion="x", reward=0.0, correct=False, sum_logprob=None) -> Candidate:
    return Candidate(index=index, completion=completion, reward=reward, correct=correct, sum_logprob=sum_logprob)


def best_both_ways(*candidates: Candidate) -> Candidate:
    forward, backward = select_best(candidates), select_best(candidates[::-1])
    assert forward == backward
    return forward


def test_highest_reward_wins_over_everything_else():
    winner = best_both_ways(cand(0, "a", 0.5, sum_logprob=-0.1), cand(1, "a much longer one", 0.9, sum_logprob=-50))
    assert winner.index == 1


def test_equal_reward_higher_logprob_wins():
    winner = best_both_ways(cand(0, "short", 1.0, sum_logprob=-5.0), cand(1, "longer text", 1.0, sum_logprob=-2.0))
    assert winner.index == 1


def test_equal_reward_and_logprob_shorter_wins():
    assert best_both_ways(cand(0, "abcdef", 1.0, sum_logprob=-2.0), cand(1, "zz", 1.0, sum_logprob=-2.0)).index == 1


def test_equal_everything_but_text_lexicographically_smaller_wins():
    assert best_both_ways(cand(0, "bb", 1.0, sum_logprob=-2.0), cand(1, "ab", 1.0, sum_logprob=-2.0)).index == 1


def test_none_logprob_loses_to_any_number():
    # even to a very low logprob, and to one worse than the 0.0 a naive "None -> 0.0" key would use
    assert best_both_ways(cand(0, "a", 1.0, sum_logprob=None), cand(1, "zzzz", 1.0, sum_logprob=-1e9)).index == 1
    assert best_both_ways(cand(0, "a", 1.0, sum_logprob=None), cand(1, "zzzz", 1.0, sum_logprob=-0.5)).index == 1


def test_nan_reward_loses_to_every_number():
    assert best_both_ways(cand(0, "a", NAN, sum_logprob=0.0), cand(1, "zzzz", -math.inf)).index == 1
    assert best_both_ways(cand(0, "a", NAN), cand(1, "b", NAN)).index == 0  # among NaNs the tie-breaks still apply


def test_identical_but_index_picks_the_lower_index():
    assert best_both_ways(cand(3, "same", 1.0, sum_logprob=-1.0), cand(1, "same", 1.0, sum_logprob=-1.0)).index == 1


def test_select_best_refuses_only_an_empty_sequence():
    with pytest.raises(ValueError):
        select_best([])
    assert select_best([cand(0, "", NAN, sum_logprob=NAN)]).index == 0


# --- determinism --------------------------------------------------------------------------------------------


def tie_heavy_examples() -> list[list[Candidate]]:
    """Eight examples of n=6 built to tie: shared rewards, None and equal logprobs, equal lengths, duplicates."""
    rng = random.Random(1234)
    examples = []
    for _ in range(8):
        candidates = [
            cand(
                i,
                rng.choice(["4", "5", "42", "x=4", "24"]),
                rng.choice([0.0, 1.0, 1.0, NAN]),
                rng.random() < 0.5,
                rng.choice([None, -1.0, -1.0, -3.5]),
            )
            for i in range(6)
        ]
        candidates.append(dataclasses.replace(candidates[0], index=6))  # identical in every key but the index
        examples.append(candidates[:6] if rng.random() < 0.3 else candidates[1:])
    return examples


def test_same_output_hash_over_five_shuffled_runs():
    examples = tie_heavy_examples()
    reports = []
    for seed in range(5):
        rng = random.Random(seed)
        shuffled = [rng.sample(candidates, len(candidates)) for candidates in examples]
        reports.append(select(shuffled, ks=(1, 2, 6)))
    assert len({report.digest for report in reports}) == 1
    assert all(len(report.digest) == 64 for report in reports)
    assert all(repr(report.selected) == repr(reports[0].selected) for report in reports)
    assert all(report.pass_at == reports[0].pass_at for report in reports)


floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1.0, NAN])
candidates = st.builds(
    Candidate,
    index=st.integers(0, 3),  # small, so duplicate indices occur
    completion=st.text(alphabet="ab", max_size=3),
    reward=st.sampled_from([0.0, -0.0, 0.5, 1.0, NAN, math.inf, -math.inf]) | floats,
    correct=st.booleans(),
    sum_logprob=st.none() | st.sampled_from([-1.0, 0.0, -0.0, NAN]) | floats,
)


@given(st.lists(candidates, min_size=1, max_size=8).flatmap(lambda xs: st.tuples(st.just(xs), st.permutations(xs))))
def test_select_best_is_invariant_under_permutation(pair):
    original, permuted = pair
    assert repr(select_best(permuted)) == repr(select_best(original))


# --- select() -----------------------------------------------------------------------------------------------


def hand_built() -> list[list[Candidate]]:
    return [
        # the single correct sample has the top reward: selected, correct
        [cand(0, "4", 1.0, True), cand(1, "5", 0.0), cand(2, "6", 0.0), cand(3, "7", 0.0)],
        # the scorer ranks the single correct one first although it is not sample 0: selected, correct
        [cand(0, "41", 0.2), cand(1, "42", 0.9, True), cand(2, "43", 0.1), cand(3, "44", 0.0)],
        # nothing correct; a reward tie goes to the higher logprob: selected index 1, wrong
        [cand(0, "9", 0.5, sum_logprob=-3.0), cand(1, "8", 0.5, sum_logprob=-1.0), cand(2, "7"), cand(3, "6")],
    ]


def test_select_reports_exact_numbers_on_a_hand_built_case():
    report = select(hand_built(), ks=(4, 2, 1, 2))
    assert isinstance(report, SelectionReport)
    assert (report.n, report.examples) == (4, 3)
    assert [c.index for c in report.selected] == [0, 1, 1]
    assert [c.correct for c in report.selected] == [True, True, False]
    assert report.selected_accuracy == pytest.approx(2 / 3)
    assert list(report.pass_at) == [1, 2, 4]  # deduplicated and sorted
    assert report.pass_at[1] == pytest.approx(1 / 6)  # mean of 1/4, 1/4, 0
    assert report.pass_at[2] == pytest.approx(1 / 3)  # mean of 1/2, 1/2, 0
    assert report.pass_at[4] == pytest.approx(2 / 3)  # mean of 1, 1, 0
    # selection lifts the reported number far above single-sample accuracy, with no learning at all
    assert report.selected_accuracy > report.pass_at[1]
    assert "not learning" in report.label
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.n = 5  # type: ignore[misc]


def test_digest_follows_the_selected_candidates():
    examples = hand_built()
    baseline = select(examples).digest
    assert select(hand_built()).digest == baseline
    assert select(examples, ks=(1, 4)).digest == baseline  # the hash covers the selection, not the ks asked for
    examples[2][0] = cand(0, "9", 0.6)  # now a different candidate wins example 2
    assert select(examples).digest != baseline
    assert select(hand_built()[::-1]).digest != baseline  # example order is part of the record


def test_select_refuses_ragged_or_empty_examples_naming_the_example():
    examples = hand_built()
    examples[2] = examples[2][:3]
    with pytest.raises(ValueError, match="example 2"):
        select(examples)
    with pytest.raises(ValueError, match="example 0"):
        select([[], []])
    with pytest.raises(ValueError):
        select([])


@pytest.mark.parametrize("ks", [(0,), (5,), (1, 5), ()])
def test_select_refuses_ks_outside_1_to_n(ks):
    with pytest.raises(ValueError, match="ks"):
        select(hand_built(), ks=ks)
