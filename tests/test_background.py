"""tests/background.py: who runs each task of the lane, jobs that need other jobs, and parses that wait."""

import ast
import os
import subprocess
import sys
import threading
import time

import background as lane
import pytest
from background import JOBS, Lane, background, job


@pytest.fixture
def jobs():
    """These tests' jobs leave no trace in the registry (the suite's own lane never sees them: each test queues
    its jobs in a lane of its own)."""
    before = set(JOBS)
    yield
    for name in set(JOBS) - before:
        JOBS.pop(name), lane.SECONDS.pop(name)


def recorder(log: list, name: str, gate: threading.Event | None = None):
    """A task that waits for `gate`, then notes which thread ran it."""

    def task():
        if gate is not None:
            assert gate.wait(10), f"{name} waited 10 s for its gate"
        log.append((name, threading.current_thread().name))
        return name

    return task


def wait_for(condition) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the lane's workers did not finish in 10 s"
        time.sleep(0.01)


def test_the_first_worker_takes_tasks_in_order_the_second_stealable_ones_from_the_back_the_third_timed_ones():
    log, gate, tasks = [], threading.Event(), Lane()
    tasks.queue({"cpu": recorder(log, "cpu", gate), "T4": recorder(log, "T4")})  # kernel runs: never stolen
    tasks.queue({"rebuild": recorder(log, "rebuild"), "job": recorder(log, "job")}, stealable={"rebuild", "job"})
    tasks.queue(
        {"hub": recorder(log, "hub"), "probe": recorder(log, "probe")}, stealable={"hub"}, timed={"hub", "probe"}
    )
    tasks.start()
    wait_for(lambda: len(log) == 4)  # the second and third workers, done while the first still waits in cpu
    gate.set()
    wait_for(lambda: len(log) == 6)
    back, waits = (
        [entry for entry in log if entry[1] == "lane-back"],
        [entry for entry in log if entry[1] == "lane-timed"],
    )
    assert back == [("job", "lane-back"), ("rebuild", "lane-back")] and log[4:] == [("cpu", "lane"), ("T4", "lane")]
    assert waits == [("hub", "lane-timed"), ("probe", "lane-timed")]  # in order, and never taken by the others
    assert [tasks.value(name) for name in ("cpu", "T4", "hub")] == ["cpu", "T4", "hub"]
    assert set(tasks.seconds) == set(tasks.ran_by) == {"cpu", "T4", "rebuild", "job", "hub", "probe"}


def test_a_test_that_needs_a_task_no_worker_started_runs_it_itself():
    log, tasks = [], Lane()
    tasks.queue({"08-again": recorder(log, "08-again")})  # queued, no worker started
    assert tasks.value("08-again") == "08-again"
    assert log == [("08-again", threading.current_thread().name)] and tasks.ran_by["08-again"] == "MainThread"


def test_an_error_in_a_task_is_raised_again_in_every_test_that_asks():
    tasks = Lane()

    def broken():
        raise RuntimeError("the reference run never finished")

    tasks.queue({"broken": broken})
    for _ in range(2):
        with pytest.raises(RuntimeError, match="never finished"):
            tasks.value("broken")


def test_a_job_gets_the_value_of_the_job_it_names_run_first_by_whoever_needs_it(jobs, monkeypatch):
    monkeypatch.setattr(lane, "LANE", Lane())

    def made_first(folder, env):
        (folder / "weights").write_text("4 steps")
        return folder

    def made_second(folder, env, made_first):
        return (made_first / "weights").read_text(), folder != made_first, env["KIT_TEST"]

    background(made_first), background(made_second)
    lane.LANE.queue({name: job(name, {"KIT_TEST": "1"}) for name in ("made_first", "made_second")})
    assert lane.value("made_second", {}) == ("4 steps", True, "1")  # its own folder, the lane's environment
    assert lane.LANE.ran_by == {"made_first": "MainThread", "made_second": "MainThread"}


def test_an_error_in_the_job_named_is_raised_in_every_job_that_needs_it(jobs, monkeypatch):
    monkeypatch.setattr(lane, "LANE", Lane())

    def broken(folder, env):
        raise RuntimeError("the reference run never finished")

    def needs_broken(folder, env, broken):
        return "never reached"

    background(broken), background(needs_broken)
    with pytest.raises(RuntimeError, match="never finished"):
        lane.value("needs_broken", {})  # queued by nothing: run here, its need first
    with pytest.raises(RuntimeError, match="never finished"):
        lane.value("broken", {})


def test_a_job_that_names_a_job_defined_after_it_is_refused_where_it_is_defined(jobs):
    def early(folder, env, later):
        return later

    with pytest.raises(ValueError, match="early needs later: define that background fixture above it"):
        background(early)


def test_a_parse_in_another_thread_waits_for_the_one_under_way():
    """CPython 3.11's AST depth counter is one per interpreter (python/cpython#106905): a job's parse must wait."""
    done = threading.Event()
    with lane._parsing:  # a parse under way in this thread
        parser = threading.Thread(target=lambda: (ast.parse("x = [1, (2, 3)]"), done.set()))
        parser.start()
        assert not done.wait(0.2)
    assert done.wait(10)
    parser.join()


@pytest.mark.skipif(sys.platform != "linux", reason="a nice value per thread is Linux's")
def test_the_second_worker_and_what_it_starts_only_fill_the_gaps():
    tasks, ours, rebuilt = Lane(), os.getpriority(os.PRIO_PROCESS, 0), threading.Event()

    def niceness(gate: threading.Event | None = None):  # of a process the task starts
        if gate is not None:
            assert gate.wait(10)  # the first worker holds cpu until the second has taken rebuild
        done = subprocess.run(["nice"], capture_output=True, text=True).stdout
        rebuilt.set()
        return done

    tasks.queue({"cpu": lambda: niceness(rebuilt), "rebuild": niceness}, stealable={"rebuild"})
    tasks.start()
    wait_for(lambda: len(tasks.ran_by) == 2)
    assert tasks.ran_by == {"cpu": "lane", "rebuild": "lane-back"}
    assert int(tasks.value("cpu")) == ours  # the notebook runs keep the tests' priority
    assert int(tasks.value("rebuild")) == min(ours + lane.NICENESS, 19)
    assert os.getpriority(os.PRIO_PROCESS, 0) == ours


def test_a_chain_of_jobs_is_queued_last_so_the_second_worker_starts_it_first(jobs):
    def first(folder, env):
        return 1

    def needs_first(folder, env, first):
        return first + 1

    def alone(folder, env):
        return 0

    background(first), background(needs_first), background(alone)
    assert lane.in_lane_order(["needs_first", "alone", "first", "not_a_job"]) == ["first", "alone", "needs_first"]


def test_the_second_worker_starts_the_longest_job_first_and_the_first_takes_the_shortest_once_its_runs_are_done(jobs):
    def rebuild(folder, env):
        return 45

    def dry_run(folder, env):
        return 20

    def template(folder, env):
        return 4

    background(rebuild, seconds=45), background(dry_run, seconds=20), background(template, seconds=4)
    order = lane.in_lane_order(["rebuild", "template", "dry_run"], {"smoke": ("cpu",)})
    assert order == ["template", "dry_run", "rebuild"], "no run used: the jobs alone, the shortest first"
    tasks = Lane()
    tasks.queue({name: lambda: None for name in order}, stealable=set(order))
    # what each worker takes next: the second from the back, the first (its runs done) from the front
    assert [tasks._back(), tasks._front(), tasks._back()] == ["rebuild", "template", "dry_run"]


def test_a_job_that_needs_a_notebook_run_gets_its_value_and_is_queued_right_after_it(jobs, monkeypatch):
    monkeypatch.setattr(lane, "LANE", Lane())
    monkeypatch.setitem(lane.RUNS, "smoke", lambda: "the smoke run's folder")
    monkeypatch.setitem(lane.RUNS, "simulated", lambda: "the simulated runs")

    def launched(folder, env, smoke):  # e.g. a script the smoke run wrote, run again by hand
        return f"relaunched from {smoke}"

    def compared(folder, env, simulated, smoke):
        return simulated, smoke

    def alone(folder, env):
        return 0

    background(launched), background(compared), background(alone)
    runs = {"smoke": ("cpu",), "simulated": ("T4", "T4x2"), "unused": ("never",)}
    order = lane.in_lane_order(["alone", "launched", "compared"], runs)
    assert order == ["cpu", "launched", "T4", "T4x2", "compared", "alone"], "each after the last run it needs"
    assert lane.needs_runs("launched") and lane.needs_runs("compared") and not lane.needs_runs("alone")
    assert lane.value("launched", {}) == "relaunched from the smoke run's folder"


def test_no_process_starts_while_an_executable_is_being_written(tmp_path):
    """A process started meanwhile would hold the script open for writing until its exec: "Text file busy"."""
    started = threading.Event()
    with lane._spawning:  # a write under way in this thread
        other = threading.Thread(target=lambda: (subprocess.run(["true"]), started.set()))
        other.start()
        assert not started.wait(0.2)
    assert started.wait(10)
    other.join()
    script = lane.write_executable(tmp_path / "scontrol", "#!/bin/sh\necho ran\n")
    assert subprocess.run([script], capture_output=True, text=True).stdout == "ran\n"
