"""`python -m helpers plan` and the quickcheck pass-through, as a user types them."""

import subprocess
import sys

import pytest


def helpers_cli(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True, timeout=120)


def test_plan_answers_a_7b_qlora_question_for_a_t4():
    done = helpers_cli("plan", "--model", "Mistral-7B", "--gpu", "T4", "--seq-len", "512", "--qlora")
    assert done.returncode == 0, done.stderr
    assert "Mistral-7B (7.24B parameters" in done.stdout and "qlora, fp16" in done.stdout  # a T4 plans in fp16
    assert "fits T4 (14.75 GiB as PyTorch reports it; nvidia-smi shows 15,360 MiB): yes" in done.stdout


def test_plan_without_a_method_walks_to_qlora():
    done = helpers_cli("plan", "--model", "Mistral-7B", "--seq-len", "512", "--per-device-batch", "4")
    assert done.returncode == 0, done.stderr
    assert "fits T4 (14.75 GiB as PyTorch reports it; nvidia-smi shows 15,360 MiB): no" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("QLoRA") and " yes " in last


def test_plan_takes_gib_for_a_card_outside_the_catalog():
    done = helpers_cli("plan", "--model", "SmolLM2-135M", "--gpu", "8.0", "--seq-len", "256")
    assert done.returncode == 0, done.stderr
    assert "fits 8.00 GiB: yes" in done.stdout


def test_plan_with_an_unknown_model_names_the_nearest_in_the_catalog():
    done = helpers_cli("plan", "--model", "Mistral-9B", "--seq-len", "512")
    assert done.returncode == 2
    assert "unknown model 'Mistral-9B': the catalog has no such name; the nearest are Mistral-7B" in done.stderr


def test_plan_answers_llama_3_8b_qlora_at_2048_tokens_on_a_t4_with_the_stack_and_the_whole_ladder():
    done = helpers_cli("plan", "--model", "Llama-3-8B", "--gpu", "T4", "--seq-len", "2048", "--qlora")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("Llama-3-8B (meta-llama/Meta-Llama-3-8B) has the shapes of the catalog's Llama-3.1-8B")
    assert (
        lines[2].startswith("assumes: the Hugging Face Trainer; fp16 mixed precision")
        and "no fused kernels" in lines[2]
    )
    steps = [line.split("  ")[0] for line in lines[lines.index(next(x for x in lines if x.startswith("step "))) + 1 :]]
    assert steps == ["as asked", "fused loss", "gradient checkpointing"]
    assert " yes " in lines[-1] and "(cost: about a third more compute a step)" in lines[-1]


def test_quickcheck_is_reachable_from_the_kit_command():
    done = helpers_cli("quickcheck", "--help")
    assert done.returncode == 0 and "student" in done.stdout and "grade" in done.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu", "inf"], "argument --gpu: inf is out of range: pass the card's memory in GiB above 0"),
        (["--gpu=-3"], "argument --gpu: -3 is out of range"),
        (["--gpu", "nan"], "argument --gpu: nan is out of range"),
        (["--gpu", "0"], "argument --gpu: 0 is out of range"),
        (["--gpu", "16000000000"], "e.g. --gpu 15.0 (or a card: --gpu T4)"),  # bytes, not GiB
        (["--lora", "--lora-r", "-1"], "argument --lora-r: -1 is out of range: pass a whole number from 1 to 4,096"),
        (["--qlora", "--lora-r", "0"], "argument --lora-r: 0 is out of range"),
        (["--lora-r", "8.5"], "argument --lora-r: '8.5' is not a whole number: pass e.g. --lora-r 16"),
        (["--batch-size", "-2"], "argument --batch-size: -2 is out of range"),
        (["--seq-len", "99999999"], "--seq-len: 99999999 is out of range: pass a whole number from 1 to 1,048,576"),
    ],
)
def test_plan_refuses_numbers_that_are_not_a_plan(flags, message):
    args = ["plan", "--model", "Mistral-7B", *flags]
    done = helpers_cli(*args, *([] if "--seq-len" in flags else ["--seq-len", "512"]))
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""  # no estimate printed from nonsense


def test_plan_still_takes_a_card_name_or_sane_gib():
    done = helpers_cli("plan", "--model", "SmolLM2-135M", "--gpu", "A100-80GB", "--seq-len", "256", "--lora-r", "64")
    assert done.returncode == 0, done.stderr
    done = helpers_cli("plan", "--model", "SmolLM2-135M", "--gpu", "nope", "--seq-len", "256")
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_plan_for_a_hand_written_loop_counts_what_it_keeps():
    args = ("plan", "--model", "Qwen2.5-0.5B", "--gpu", "T4", "--per-device-batch", "4", "--seq-len", "1024", "--lora")
    trainer, custom = helpers_cli(*args), helpers_cli(*args, "--loop", "custom")
    assert trainer.returncode == custom.returncode == 0, custom.stderr
    assert "loop trainer" in trainer.stdout and "held by the loop" not in trainer.stdout
    assert "loop custom" in custom.stdout
    held = next(line for line in custom.stdout.splitlines() if line.startswith("model output (held by the loop)"))
    assert float(held.split()[-2]) > 1.0  # GiB: 4 x 1024 logits over 151,936 tokens in fp16, and the cache
    wrong = helpers_cli(*args, "--loop", "mine")
    assert (
        wrong.returncode == 2 and "argument --loop: 'mine' is not one of 'trainer', 'custom', 'litgpt'" in wrong.stderr
    )


def test_plan_names_the_attention_kernel_and_rests_its_verdict_on_reserved_memory():
    """Qwen2.5 has grouped key/value heads: on a T4 (no flash attention) SDPA runs its math kernel."""
    args = ("plan", "--model", "Qwen2.5-1.5B", "--seq-len", "2048", "--qlora", "--checkpointing")
    t4, a100 = helpers_cli(*args, "--gpu", "T4"), helpers_cli(*args, "--gpu", "A100-40GB")
    assert t4.returncode == a100.returncode == 0, t4.stderr
    assert "; PyTorch SDPA attention, math kernel (the scores materialized);" in t4.stdout
    assert "; PyTorch SDPA attention, flash kernel;" in a100.stdout
    verdict = next(line.strip() for line in t4.stdout.splitlines() if "which is what runs out" in line)
    assert verdict.startswith("fits: the training step needs") and "leaves 10% free" in verdict
    rows = {line[:32].strip(): float(line.split()[-2]) for line in t4.stdout.splitlines() if line.endswith(" GiB")}
    assert rows["peak reserved"] == pytest.approx(rows["peak allocated"] + rows["allocator slack"], abs=0.011)
    screen = rows["total (what nvidia-smi shows)"]
    assert screen == pytest.approx(rows["peak reserved"] + rows["CUDA context"], abs=0.011)
