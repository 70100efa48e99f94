"""Faults injected into 2-rank launches (``hyper-train run --nproc-per-node 2``): the launch
ends within its timeout + 30 s (never hangs), its exit code and report name the rank and cause
that started it, and the latest complete checkpoint resumes to the same per-step losses, bit for
bit, as the uninterrupted 2-rank run.

Every case is the same tiny text run (:data:`STEPS` steps, ddp, a checkpoint every 2 steps)
with one fault from ``chaos_plugin`` (:data:`FAULTS`). The module's fixture launches each
fault once, then resumes every case, after the uninterrupted reference run, in ONE 2-rank
``dist_worker.py`` launch (each launch costs two imports of torch and transformers); each test
asserts its own case. Every subprocess has a time limit."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from dist_helpers import (
    HERE,
    hyper_train,
    losses,
    split_job_logs,
    subprocess_env,
    text_config,
    torchrun,
    write_toml,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: Steps of every run; the collective timeout and stall timeout of the runs.
STEPS = 10
TIMEOUT_S = 30
#: Every case ends within this long (the issue's bound: the timeout + 30 s).
EXIT_BOUND_S = TIMEOUT_S + 30
#: A subprocess still running after this long hung (it is killed, the test fails).
HANG_S = 90


@attrs.frozen
class Fault:
    """A case: its config sections, the chaos plugin's variables, and, for a signal from
    outside, the steps logged before SIGINT is sent to the launcher."""

    sections: dict[str, dict[str, Any]]
    env: dict[str, str]
    sigint_after: int | None = None


FAULTS = {
    # SIGKILL of rank 1 while step-4 is written (the OOM killer, a preemption's grace run out).
    "killed": Fault({}, {"HT_SIGNAL_IN_SAVE_STEP": "4", "HT_KILL_RANK": "1"}),
    # SIGKILL of rank 0's data worker as step 4 begins.
    "worker": Fault(
        {"data": {"num_workers": 1}}, {"HT_KILL_WORKER_AT_STEP": "3", "HT_KILL_RANK": "0"}
    ),
    # Rank 1 frozen (SIGSTOP) as step 4 begins; a 3 s stall timeout.
    "stalled": Fault(
        {"training": {"stall_timeout_s": 3}},
        {"HT_KILL_AT_STEP": "3", "HT_KILL_RANK": "1", "HT_KILL_SIGNAL": "SIGSTOP"},
    ),
    # SIGINT to the launcher after step 2 of a slowed run (no periodic checkpoints).
    "sigint": Fault({"checkpoint": {"every_steps": None}}, {"HT_STEP_DELAY_S": "0.5"}, 2),
    # SIGTERM to rank 1 while step-4 is written (preemption).
    "sigterm_in_save": Fault(
        {}, {"HT_SIGNAL_IN_SAVE_STEP": "4", "HT_KILL_RANK": "1", "HT_KILL_SIGNAL": "SIGTERM"}
    ),
    # Rank 1's plugin raises in on_step_begin of step 5 (progress printed as lines).
    "plugin_error": Fault(
        {"logging": {"progress": "lines"}}, {"HT_FAIL_RANK": "1", "HT_FAIL_AT_STEP": "4"}
    ),
}


def _raw(out: Path, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    raw = text_config(
        out,
        parallel={"strategy": "ddp", "timeout_s": TIMEOUT_S},
        training={"steps": STEPS, "lr_scheduler": "constant", "stall_timeout_s": TIMEOUT_S},
        checkpoint={"every_steps": 2, "keep_last": None},
    )
    for name, values in sections.items():
        raw[name].update(values)
    return raw


@attrs.frozen
class Launched:
    """A case's launch: its exit code, stderr, seconds to exit (from the start, or from the
    SIGINT), and what it left: the steps it logged, its checkpoint folders (``step-N``, and
    whether each is complete), what ``latest`` named."""

    out: Path
    returncode: int
    stderr: str
    elapsed: float
    logged: dict[int, float]
    checkpoints: dict[str, bool]
    latest: str | None

    @classmethod
    def of(cls, out: Path, returncode: int, stderr: str, elapsed: float) -> Launched:
        ckpts = out / "checkpoints"
        latest = ckpts / "latest"
        return cls(
            out,
            returncode,
            stderr,
            elapsed,
            losses(out) if (out / "metrics.jsonl").is_file() else {},
            {p.name: (p / "COMPLETE").is_file() for p in ckpts.glob("step-*")},
            latest.read_text() if latest.is_file() else None,
        )


@attrs.frozen
class Outcome:
    """A case's launch, and the losses its resume from ``latest`` logged (None: no latest)."""

    launched: Launched
    resumed: dict[int, float] | None


@attrs.frozen
class Faults:
    """Every case's outcome, and the uninterrupted run's ``step -> loss``."""

    outcomes: dict[str, Outcome]
    reference: dict[int, float]


def _launch(toml: Path, fault: Fault) -> tuple[int, str, float]:
    """Run the case: ``(returncode, stderr, seconds to exit)``."""
    args = ["run", str(toml), "--nproc-per-node", "2", "--plugin", "chaos_plugin"]
    if fault.sigint_after is None:
        t0 = time.monotonic()
        proc = hyper_train(args, timeout=HANG_S, **fault.env)
        return proc.returncode, proc.stderr, time.monotonic() - t0
    cmd = [sys.executable, "-m", "hyper_core", *args]
    return _sigint_when(cmd, toml.parent / "run", fault.sigint_after, fault.env)


def _sigint_when(
    cmd: list[str], out: Path, steps: int, env: dict[str, str]
) -> tuple[int, str, float]:
    """Run ``cmd``; SIGINT it once ``out`` logged ``steps`` steps; the seconds counted from
    the signal."""
    proc = subprocess.Popen(
        cmd, env=subprocess_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + HANG_S
        metrics = out / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= steps):
            if proc.poll() is not None or time.monotonic() > deadline:
                break  # the test reports the returncode and stderr
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=HANG_S)
        return proc.returncode, err, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=HANG_S)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Faults:
    """Each case launched once; then, in one 2-rank launch, the uninterrupted reference run
    and each case's resume from its ``latest`` (``checkpoint.resume = "auto"``). The
    reference is a 2-rank run too: 2-rank ddp is not bit-equal to 1 rank (gradients are
    summed in another order)."""
    root = tmp_path_factory.mktemp("faults")
    launched: dict[str, Launched] = {}
    for name, fault in FAULTS.items():
        out = root / name / "run"
        toml = write_toml(_raw(out, fault.sections), root / name / "run.toml")
        launched[name] = Launched.of(out, *_launch(toml, fault))
    reference_out = root / "reference"
    jobs = [{"config": _raw(reference_out, {})}]
    first_lines: dict[str, int] = {}
    for name, case in launched.items():
        out = case.out
        if case.latest is None:
            continue  # nothing to resume: the case's test fails on it
        first_lines[name] = len((out / "metrics.jsonl").read_text().splitlines())
        sections = {**FAULTS[name].sections, "checkpoint": {"resume": "auto"}}
        config = _raw(out, sections)
        config["training"]["stall_timeout_s"] = TIMEOUT_S  # a slow step on a busy machine
        jobs.append({"config": config})
    jobs_file = root / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = torchrun(HERE / "dist_worker.py", [str(jobs_file)], nproc=2, timeout=HANG_S + 60)
    logs = split_job_logs(proc.stderr)
    assert proc.returncode == 0, f"{list(logs)[-1:]} failed:\n{proc.stderr[-6000:]}"
    outcomes = {
        name: Outcome(case, losses(case.out, first_lines[name]) if name in first_lines else None)
        for name, case in launched.items()
    }
    return Faults(outcomes, losses(reference_out))


def _report(stderr: str) -> list[str]:
    """The launcher's report: its lines naming ranks (a quoted last line is not one)."""
    lines = stderr.splitlines()
    return [line for line in lines if re.match(r"hyper-train: (rank \d+ |  consequence)", line)]


def _assert_resumes_to_reference(faults: Faults, case: str, latest: int) -> None:
    """``latest`` names ``step-<latest>``, complete, and the resume from it logged steps
    ``latest+1 .. STEPS`` with the uninterrupted run's losses, bit-identical."""
    outcome, reference = faults.outcomes[case], faults.reference
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert outcome.launched.latest == f"step-{latest}"
    assert outcome.launched.checkpoints[f"step-{latest}"]  # complete
    assert outcome.resumed is not None
    assert sorted(outcome.resumed) == list(range(latest + 1, STEPS + 1)), outcome.resumed
    assert outcome.resumed == {step: reference[step] for step in outcome.resumed}


def test_a_rank_killed_while_saving_is_named_and_resumes_from_the_last_complete(
    faults: Faults,
) -> None:
    """Rank 1 SIGKILLed while step-4 is written: exit 1; the report blames rank 1 and its
    signal, not rank 0's lost connection, and quotes rank 1's last line (not the bar fragment
    it wrote after it); ``latest`` still names step-2, which resumes to the reference."""
    run = faults.outcomes["killed"].launched
    assert run.returncode == 1, run.stderr[-4000:]
    assert run.elapsed < EXIT_BOUND_S
    report = _report(run.stderr)
    assert report[0] == (
        "hyper-train: rank 1 was killed by signal 9 (SIGKILL: out of memory?) "
        "at step 4 (checkpoint)"
    ), run.stderr[-4000:]
    assert all("consequence" in line for line in report[1:]), report
    last = "hyper-train:   last output of rank 1: chaos: rank 1 sends itself SIGKILL"
    assert f"{last} while step-4 is saved\n" in run.stderr, run.stderr[-4000:]
    assert "Traceback" not in run.stderr
    assert "step-4" not in run.checkpoints
    _assert_resumes_to_reference(faults, "killed", 2)


def test_a_dead_data_worker_is_named_by_its_rank_and_the_run_resumes(faults: Faults) -> None:
    """Rank 0's data worker SIGKILLed as step 4 begins: exit 1, the report names the worker
    and its rank (rank 1's lost connection a consequence); step-2 resumes to the reference."""
    run = faults.outcomes["worker"].launched
    assert run.returncode == 1, run.stderr[-4000:]
    assert run.elapsed < EXIT_BOUND_S
    report = _report(run.stderr)
    assert re.fullmatch(
        r"hyper-train: rank 0 failed at step 4: data worker 0 of rank 0 died \(signal 9\)",
        report[0],
    ), run.stderr[-4000:]
    assert all("consequence: rank 1" in line for line in report[1:]), report
    assert "Traceback" not in run.stderr
    _assert_resumes_to_reference(faults, "worker", 2)


def test_a_stalled_rank_is_named_the_others_dump_their_stacks_and_it_resumes(
    faults: Faults,
) -> None:
    """Rank 1 frozen (SIGSTOP) as step 4 begins; rank 0 waits in a collective. After the
    3 s stall timeout rank 0's watchdog dumps its stacks and exits; the launcher names rank 1,
    frozen, with its last line, and ends it: exit 1 within the stall timeout + 30 s. step-2
    resumes to the reference."""
    run = faults.outcomes["stalled"].launched
    assert run.returncode == 1, run.stderr[-4000:]
    assert run.elapsed < 3 + 30
    report = _report(run.stderr)
    assert re.match(
        r"hyper-train: rank 1 stalled at step 4( \(\w+\))?: its heartbeat stopped; the process "
        r"was stopped by a signal \(SIGSTOP\?\)",
        report[0],
    ), run.stderr[-4000:]
    assert any("consequence: rank 0 stalled: no progress" in line for line in report)
    last = "hyper-train:   last output of rank 1: chaos: rank 1 sends itself SIGSTOP"
    assert f"{last} as step 4 begins\n" in run.stderr, run.stderr[-4000:]
    stacks = (run.out / "stacks" / "rank-0.txt").read_text()
    assert "rank 0: no progress" in stacks and "all_reduce" in stacks
    _assert_resumes_to_reference(faults, "stalled", 2)


def test_sigint_to_the_launcher_stops_every_rank_with_a_checkpoint_that_resumes(
    faults: Faults,
) -> None:
    """``kill -INT <launcher>`` (a supervisor, a notebook) after step 2: every rank stops
    after its step, one checkpoint is saved, exit 0 with the resume hint, within the timeout
    + 30 s of the signal; that checkpoint resumes to the reference."""
    run = faults.outcomes["sigint"].launched
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.elapsed < EXIT_BOUND_S
    err = run.stderr
    stopped_at = max(run.logged)
    assert 2 <= stopped_at < STEPS
    assert "hyper-train: received SIGINT: every rank stops after its current step" in err
    assert f"interrupted at step {stopped_at}/{STEPS}; checkpoint saved" in err, err[-4000:]
    assert "run the same command with --checkpoint.resume=auto" in err
    assert run.checkpoints == {f"step-{stopped_at}": True}
    _assert_resumes_to_reference(faults, "sigint", stopped_at)


def test_sigterm_to_one_rank_while_it_saves_ends_cleanly_and_resumes(faults: Faults) -> None:
    """SIGTERM to rank 1 while step-4 is written (preemption): the write completes, every
    rank stops after the next step, saves it, and the launch exits 0; step-5 resumes to the
    reference."""
    run = faults.outcomes["sigterm_in_save"].launched
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.elapsed < EXIT_BOUND_S
    assert run.checkpoints == {"step-2": True, "step-4": True, "step-5": True}
    assert max(run.logged) == 5
    assert f"at step 5/{STEPS}; checkpoint saved" in run.stderr, run.stderr[-4000:]
    _assert_resumes_to_reference(faults, "sigterm_in_save", 5)


def test_an_exception_in_a_plugin_hook_names_its_rank_and_the_run_resumes(
    faults: Faults,
) -> None:
    """Rank 1's plugin raises in ``on_step_begin`` of step 5: exit 1, the report names rank 1,
    its step and its error (rank 0's lost peer a consequence); only rank 0 printed progress;
    step-4 resumes to the reference."""
    run = faults.outcomes["plugin_error"].launched
    assert run.returncode == 1, run.stderr[-4000:]
    assert run.elapsed < EXIT_BOUND_S
    err = run.stderr
    report = _report(err)
    assert report[0] == (
        "hyper-train: rank 1 failed at step 5: RuntimeError: chaos: injected failure at step 5"
    ), err[-4000:]
    assert all(line.startswith("hyper-train:   consequence") for line in report[1:]), err[-4000:]
    assert [err.count(f"step {s}/{STEPS}") for s in range(1, 6)] == [1, 1, 1, 1, 0]
    _assert_resumes_to_reference(faults, "plugin_error", 4)
