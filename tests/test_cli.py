"""`python -m helpers plan` and the quickcheck pass-through, as a user types them."""

import subprocess
import sys


def helpers_cli(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True, timeout=120)


def test_plan_answers_a_7b_qlora_question_for_a_t4():
    done = helpers_cli("plan", "--model", "Mistral-7B", "--gpu", "T4", "--seq-len", "512", "--qlora")
    assert done.returncode == 0, done.stderr
    assert "Mistral-7B (7.24B parameters" in done.stdout and "qlora, fp16" in done.stdout  # a T4 plans in fp16
    assert "fits T4 (15.0 GiB): yes" in done.stdout


def test_plan_without_a_method_walks_to_qlora():
    done = helpers_cli("plan", "--model", "Mistral-7B", "--seq-len", "512", "--batch-size", "4")
    assert done.returncode == 0, done.stderr
    assert "fits T4 (15.0 GiB): no" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("QLoRA") and " yes " in last


def test_plan_takes_gib_for_a_card_outside_the_catalog():
    done = helpers_cli("plan", "--model", "SmolLM2-135M", "--gpu", "8.0", "--seq-len", "256")
    assert done.returncode == 0, done.stderr
    assert "fits 8.0 (8.0 GiB): yes" in done.stdout


def test_plan_with_an_unknown_model_lists_the_catalog():
    done = helpers_cli("plan", "--model", "Mistral-9B", "--seq-len", "512")
    assert done.returncode == 2
    assert "unknown model 'Mistral-9B': the catalog has" in done.stderr and "Mistral-7B" in done.stderr


def test_quickcheck_is_reachable_from_the_kit_command():
    done = helpers_cli("quickcheck", "--help")
    assert done.returncode == 0 and "student" in done.stdout and "grade" in done.stdout
