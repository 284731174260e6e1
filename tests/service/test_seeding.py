from service.runner.seeding import batch_for_step, derive_seed


def test_derived_seeds_are_stable_and_distinct():
    assert derive_seed(0, "train", 1, "a", 0) == derive_seed(0, "train", 1, "a", 0)
    assert len({derive_seed(0, "train", 1, "a", i) for i in range(100)}) == 100
    assert 0 <= derive_seed("x") < 2**63


def test_batches_walk_through_epochs_without_repeats_and_are_resumable():
    rows = list(range(10))
    batches = [batch_for_step(rows, seed=3, step=s, size=4) for s in range(1, 6)]
    first_epoch = batches[0] + batches[1] + batches[2][:2]
    assert sorted(first_epoch) == rows  # every row once per epoch
    # a resumed run asks for step 4 directly and gets what the uninterrupted run got
    assert batch_for_step(rows, seed=3, step=4, size=4) == batches[3]
    assert batch_for_step(rows, seed=4, step=1, size=4) != batches[0]
