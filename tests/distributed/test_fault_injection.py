"""Faults injected into 2-rank launches (``hyper-train run --nproc-per-node 2``): the launch
ends within its timeout + 30 s (never hangs), its exit code and report name the rank and cause
that started it, and the latest complete checkpoint resumes (a 2-rank launch with
``--checkpoint.resume=auto``) to the same per-step losses, bit for bit, as the uninterrupted
2-rank run (:func:`reference`, once per module).

Every case is the same tiny text run (``RUN``: ddp, :data:`STEPS` steps, a checkpoint every 2)
with a fault from ``chaos_plugin``; every subprocess has a time limit."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import hyper_train, losses, subprocess_env, text_config, write_toml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

#: Steps of every run; the collective timeout and stall timeout of the runs.
STEPS = 10
TIMEOUT_S = 30
#: Every case ends within this long (the issue's bound: the timeout + 30 s).
EXIT_BOUND_S = TIMEOUT_S + 30
#: A subprocess still running after this long hung (it is killed, the test fails).
HANG_S = 90


def _raw(out: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    raw = text_config(
        out,
        parallel={"strategy": "ddp", "timeout_s": TIMEOUT_S},
        training={"steps": STEPS, "lr_scheduler": "constant", "stall_timeout_s": TIMEOUT_S},
        checkpoint={"every_steps": 2, "keep_last": None},
    )
    for name, values in sections.items():
        raw[name].update(values)
    return raw


def _config(tmp_path: Path, **sections: dict[str, Any]) -> tuple[Path, Path]:
    out = tmp_path / "run"
    return out, write_toml(_raw(out, **sections), tmp_path / "run.toml")


def _run_cmd(toml: Path, *extra: str) -> list[str]:
    return ["run", str(toml), "--nproc-per-node", "2", *extra]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """``step -> loss`` of the uninterrupted 2-rank run that every case resumes to (a 2-rank
    ddp run is not bit-equal to a 1-rank one: the gradients are summed in another order)."""
    tmp = tmp_path_factory.mktemp("reference")
    out, toml = _config(tmp)
    proc = hyper_train(_run_cmd(toml), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = losses(out)
    assert sorted(found) == list(range(1, STEPS + 1))
    return found


def _launch(toml: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = hyper_train(_run_cmd(toml, "--plugin", "chaos_plugin"), timeout=HANG_S, **env)
    return proc, time.monotonic() - t0


def _report(stderr: str) -> list[str]:
    """The launcher's report: its lines naming ranks (a quoted last line is not one)."""
    lines = stderr.splitlines()
    return [line for line in lines if re.match(r"hyper-train: (rank \d+ |  consequence)", line)]


def _assert_resumes_to_reference(
    toml: Path, out: Path, latest: int, reference: dict[int, float]
) -> None:
    """``latest`` is ``step-<latest>``, complete; a 2-rank launch resuming from it logs steps
    ``latest+1 .. STEPS`` with the reference's losses, bit-identical."""
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text() == f"step-{latest}"
    assert (ckpts / f"step-{latest}" / "COMPLETE").is_file()
    metrics = out / "metrics.jsonl"
    before = len(metrics.read_text().splitlines())
    proc = hyper_train(_run_cmd(toml, "--checkpoint.resume=auto"), timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = losses(out, first_line=before)
    assert sorted(got) == list(range(latest + 1, STEPS + 1)), sorted(got)
    assert got == {step: reference[step] for step in got}


def test_a_rank_killed_while_saving_is_named_and_resumes_from_the_last_complete(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    """SIGKILL (the out-of-memory killer, a preemption's grace run out) of rank 1 in the middle
    of writing step-4: exit 1; the report blames rank 1 and its signal, not rank 0's lost
    connection, and quotes rank 1's last line (not the bar fragment it wrote after it);
    ``latest`` still names step-2, which resumes to the reference."""
    out, toml = _config(tmp_path)
    proc, elapsed = _launch(toml, HT_SIGNAL_IN_SAVE_STEP="4", HT_KILL_RANK="1")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert elapsed < EXIT_BOUND_S
    report = _report(proc.stderr)
    assert report[0] == (
        "hyper-train: rank 1 was killed by signal 9 (SIGKILL: out of memory?) "
        "at step 4 (checkpoint)"
    ), proc.stderr[-4000:]
    assert all("consequence" in line for line in report[1:]), report
    last = "hyper-train:   last output of rank 1: chaos: rank 1 sends itself SIGKILL"
    assert f"{last} while step-4 is saved\n" in proc.stderr, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    assert not (out / "checkpoints" / "step-4").exists()
    _assert_resumes_to_reference(toml, out, 2, reference)


def test_a_dead_data_worker_is_named_by_its_rank_and_the_run_resumes(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    """SIGKILL of rank 0's data worker as step 4 begins: exit 1, the report names the worker
    and its rank (rank 1's lost connection a consequence); step-2 resumes to the reference."""
    out, toml = _config(tmp_path, data={"num_workers": 1})
    proc, elapsed = _launch(toml, HT_KILL_WORKER_AT_STEP="3", HT_KILL_RANK="0")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert elapsed < EXIT_BOUND_S
    report = _report(proc.stderr)
    assert re.fullmatch(
        r"hyper-train: rank 0 failed at step 4: data worker 0 of rank 0 died \(signal 9\)",
        report[0],
    ), proc.stderr[-4000:]
    assert all("consequence: rank 1" in line for line in report[1:]), report
    assert "Traceback" not in proc.stderr
    _assert_resumes_to_reference(toml, out, 2, reference)


def test_a_stalled_rank_is_named_the_others_dump_their_stacks_and_it_resumes(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    """Rank 1 freezes (SIGSTOP) as step 4 begins; rank 0 waits in a collective. After
    ``stall_timeout_s`` (3 s) rank 0's watchdog dumps its stacks and exits; the launcher names
    rank 1, frozen, with its last line, and ends it: exit 1 within the stall timeout + 30 s.
    step-2 resumes to the reference."""
    stall_s = 3
    out, toml = _config(tmp_path, training={"stall_timeout_s": stall_s})
    proc, elapsed = _launch(toml, HT_KILL_AT_STEP="3", HT_KILL_RANK="1", HT_KILL_SIGNAL="SIGSTOP")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert elapsed < stall_s + 30
    report = _report(proc.stderr)
    assert re.match(
        r"hyper-train: rank 1 stalled at step 4( \(\w+\))?: its heartbeat stopped; the process "
        r"was stopped by a signal \(SIGSTOP\?\)",
        report[0],
    ), proc.stderr[-4000:]
    assert any("consequence: rank 0 stalled: no progress" in line for line in report)
    last = "hyper-train:   last output of rank 1: chaos: rank 1 sends itself SIGSTOP"
    assert f"{last} as step 4 begins\n" in proc.stderr, proc.stderr[-4000:]
    stacks = (out / "stacks" / "rank-0.txt").read_text()
    assert "rank 0: no progress" in stacks and "all_reduce" in stacks
    _assert_resumes_to_reference(toml, out, 2, reference)


def _signal_when(
    cmd: list[str], out: Path, steps: int, sig: signal.Signals, **env: str
) -> tuple[int, str, float]:
    """Run ``cmd``; send ``sig`` to it once ``out`` logged ``steps`` steps:
    ``(returncode, stderr, seconds from the signal to the exit)``."""
    proc = subprocess.Popen(
        cmd, env=subprocess_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + HANG_S
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= steps):
            assert proc.poll() is None, proc.communicate(timeout=HANG_S)[1][-4000:]
            assert time.monotonic() < deadline, f"the run logged no {steps} steps"
            time.sleep(0.2)
        proc.send_signal(sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=HANG_S)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=HANG_S)
    return proc.returncode, err, elapsed


def test_sigint_to_the_launcher_stops_every_rank_with_a_checkpoint_that_resumes(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    """``kill -INT <launcher>`` (a supervisor, a notebook) after step 2 of a slowed run: every
    rank stops after its step, one checkpoint is saved, exit 0 with the resume hint; that
    checkpoint resumes to the reference."""
    out, toml = _config(tmp_path, checkpoint={"every_steps": None})
    cmd = [sys.executable, "-m", "hyper_core", *_run_cmd(toml, "--plugin", "chaos_plugin")]
    returncode, err, elapsed = _signal_when(cmd, out, 2, signal.SIGINT, HT_STEP_DELAY_S="0.5")
    assert returncode == 0, err[-4000:]
    assert elapsed < EXIT_BOUND_S
    stopped_at = max(losses(out))
    assert 2 <= stopped_at < STEPS
    assert "hyper-train: received SIGINT: every rank stops after its current step" in err
    assert f"interrupted at step {stopped_at}/{STEPS}; checkpoint saved" in err, err[-4000:]
    assert "run the same command with --checkpoint.resume=auto" in err
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == [f"step-{stopped_at}"]
    _assert_resumes_to_reference(toml, out, stopped_at, reference)


def test_sigterm_to_one_rank_while_it_saves_ends_cleanly_and_resumes(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    """SIGTERM to rank 1 while step-4 is written (preemption): the write completes, every
    rank stops after the next step, saves it, and the launch exits 0; step-5 resumes to the
    reference."""
    out, toml = _config(tmp_path)
    proc, elapsed = _launch(
        toml, HT_SIGNAL_IN_SAVE_STEP="4", HT_KILL_RANK="1", HT_KILL_SIGNAL="SIGTERM"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert elapsed < EXIT_BOUND_S
    assert (out / "checkpoints" / "step-4" / "COMPLETE").is_file()
    assert max(losses(out)) == 5
    assert f"at step 5/{STEPS}; checkpoint saved" in proc.stderr, proc.stderr[-4000:]
    _assert_resumes_to_reference(toml, out, 5, reference)


def test_an_exception_in_a_plugin_hook_names_its_rank_and_the_run_resumes(
    tmp_path: Path, reference: dict[int, float]
) -> None:
    """Rank 1's plugin raises in ``on_step_begin`` of step 5: exit 1, the report names rank 1,
    its step and its error (rank 0's lost peer a consequence); only rank 0 printed progress,
    and step-4 resumes to the reference."""
    out, toml = _config(tmp_path, logging={"progress": "lines"})
    proc, elapsed = _launch(toml, HT_FAIL_RANK="1", HT_FAIL_AT_STEP="4")
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert elapsed < EXIT_BOUND_S
    err = proc.stderr
    report = _report(err)
    assert report[0] == (
        "hyper-train: rank 1 failed at step 5: RuntimeError: chaos: injected failure at step 5"
    ), err[-4000:]
    assert all(line.startswith("hyper-train:   consequence") for line in report[1:]), err[-4000:]
    assert [err.count(f"step {s}/{STEPS}") for s in range(1, 6)] == [1, 1, 1, 1, 0]
    _assert_resumes_to_reference(toml, out, 4, reference)
