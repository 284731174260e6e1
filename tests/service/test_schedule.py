from service.training.schedule import cosine_schedule


def test_cosine_schedule_warms_up_peaks_and_decays_to_the_floor():
    rates = cosine_schedule(1e-3, 200, warmup=10, floor=0.1)
    assert len(rates) == 200
    assert abs(rates[0] - 1e-4) < 1e-12 and rates[9] < 1e-3 * 1.0001
    assert max(rates) <= 1e-3 and rates.index(max(rates)) < 15
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))  # monotone decay after warm-up
    assert abs(rates[-1] - 1e-4) < 1e-5
