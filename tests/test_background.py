"""tests/background.py: a job that needs another's value gets it, or its error; the order is checked; parses wait."""

import ast
import threading

import background as lane
import pytest
from background import JOBS, background, queue, run, value


@pytest.fixture
def jobs():
    """These tests' jobs leave no trace in the registry or the suite's closing line (the lane's own jobs, which may
    finish meanwhile, are left alone)."""
    before = set(JOBS)
    yield
    for name in set(JOBS) - before:
        for table in (JOBS, lane.SECONDS, lane._queued, lane._outcome):
            table.pop(name, None)


def test_a_job_gets_the_value_of_the_job_it_names(jobs):
    def made_first(folder, env):
        (folder / "weights").write_text("4 steps")
        return folder

    def made_second(folder, env, made_first):
        return (made_first / "weights").read_text(), folder != made_first, env["KIT_TEST"]

    background(made_first), background(made_second)
    queue(["made_first", "made_second"])
    run("made_first", {"KIT_TEST": "1"})
    run("made_second", {"KIT_TEST": "1"})
    assert value("made_second", {}) == ("4 steps", True, "1")  # its own folder, the lane's environment


def test_an_error_in_the_job_named_is_raised_in_every_job_that_needs_it(jobs):
    def broken(folder, env):
        raise RuntimeError("the reference run never finished")

    def needs_broken(folder, env, broken):
        return "never reached"

    background(broken), background(needs_broken)
    with pytest.raises(RuntimeError, match="never finished"):
        value("needs_broken", {})  # queued by nothing: run here, its need first
    with pytest.raises(RuntimeError, match="never finished"):
        value("broken", {})


def test_a_job_that_names_a_job_defined_after_it_is_refused_where_it_is_defined(jobs):
    def early(folder, env, later):
        return later

    with pytest.raises(ValueError, match="early needs later: define that background fixture above it"):
        background(early)


def test_a_parse_in_another_thread_waits_for_the_one_under_way():
    """CPython 3.11's AST depth counter is one per interpreter (python/cpython#106905): a job's parse must wait."""
    done = threading.Event()
    with lane._parsing:  # a parse under way in this thread
        job = threading.Thread(target=lambda: (ast.parse("x = [1, (2, 3)]"), done.set()))
        job.start()
        assert not done.wait(0.2)
    assert done.wait(10)
    job.join()
