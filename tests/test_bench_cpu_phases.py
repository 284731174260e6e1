"""bench/cpu_phases.py: a job's CPU use split among its phases, from samples of a real process."""

import importlib.util
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("cpu_phases", Path(__file__).parents[1] / "bench" / "cpu_phases.py")
cpu_phases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_phases)


def test_each_samples_cpu_is_shared_among_the_phases_its_interval_overlaps():
    samples = [(0.0, 0.0, 0), (1.0, 0.5, 0), (2.0, 2.5, 0), (3.0, 3.0, 0)]  # 0.5, 2.0 and 0.5 CPU seconds in three seconds
    phases = {"training": [(1.0, 2.0)], "rollouts": [(2.0, 2.5)]}
    assert cpu_phases.phase_cpu(samples, phases) == {
        "training": {"seconds": 1.0, "cpu_percent": 200, "peak_rss_gib": 0.0},
        "rollouts": {"seconds": 0.5, "cpu_percent": 50, "peak_rss_gib": 0.0},
        "other": {"seconds": 1.5, "cpu_percent": 50, "peak_rss_gib": 0.0},
    }
    assert cpu_phases.phase_cpu([], phases)["training"] == {"seconds": 0.0, "cpu_percent": 0, "peak_rss_gib": 0.0}


def test_each_phase_peaks_at_the_most_memory_sampled_inside_it():
    gib = 2**30
    samples = [(0.5, 0.0, gib), (1.5, 0.0, 3 * gib), (2.2, 0.0, 2 * gib), (2.8, 0.0, 3 * gib // 2)]
    peaks = cpu_phases.phase_cpu(samples, {"training": [(1.0, 2.0)], "rollouts": [(2.0, 2.5)], "validation": []})
    assert {name: phase["peak_rss_gib"] for name, phase in peaks.items()} == {
        "training": 3.0, "rollouts": 2.0, "validation": 0.0, "other": 1.5,
    }


def test_a_step_is_its_rollouts_then_its_training_and_a_validation_ends_when_it_is_stored():
    end = datetime(2026, 11, 29, 4, 6, 21, tzinfo=timezone.utc).timestamp()
    phases = cpu_phases.job_phases(
        [("2026-11-29 04:06:21", 10.0), ("2026-11-29 04:06:21", None)],  # a point without a duration is left out
        [("2026-11-29 04:06:21.000000", {"train_s": 2.0, "rollout_s": 3.0}), ("2026-11-29 04:06:21", {})],
    )
    assert phases["validation"] == [(end - 10.0, end)]
    assert phases["training"] == [(end - 2.0, end), (end, end)]
    assert phases["rollouts"] == [(end - 5.0, end - 2.0), (end, end)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_sampler_follows_a_real_process_cpu_time():
    spin = "import time\nwhile time.process_time() < 0.6: pass\ntime.sleep(0.3)"
    with subprocess.Popen([sys.executable, "-c", spin]) as child:
        with cpu_phases.CpuSampler(child.pid, period=0.05) as sampler:
            child.wait()
    used = [cpu for _, cpu, _ in sampler.samples]
    assert len(used) >= 5 and used == sorted(used)
    assert 0.55 <= used[-1] <= 2.0  # the spin's CPU second, the interpreter's start around it
    # while the spin runs, an interpreter's megabytes (before its exec the child is a copy of this process, as large;
    # once it exited, until it is reaped, it holds none)
    spinning = [resident for _, cpu, resident in sampler.samples if cpu > 0.1 and resident]
    assert spinning and all(2**20 < resident < 2**30 for resident in spinning)
    assert cpu_phases.cpu_seconds(child.pid) is None and cpu_phases.resident_bytes(child.pid) is None  # reaped: gone
