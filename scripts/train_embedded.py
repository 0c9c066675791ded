"""Train the embedded tiny model with the real Trainer, checkpointing as it goes; resume if told to.

    python scripts/train_embedded.py --out DIR                 # train, save every 4 steps
    python scripts/train_embedded.py --out DIR --resume        # go on from the newest whole checkpoint
    python scripts/train_embedded.py --out DIR --qlora         # the same with load_qlora (4-bit + LoRA)
    python scripts/train_embedded.py --out DIR --step-delay 0.5   # slow enough to kill it by hand

tests/test_resume.py runs it as a subprocess, kills it with SIGKILL after the first checkpoints,
resumes it, and checks that the final loss and weights equal those of an uninterrupted run:
what notebook 08 promises about surviving a disconnect. Deterministic by construction: fixed
seed, one CPU thread, no dataloader workers, the Trainer's seedable sampler.

Writes DIR/checkpoint-N/ (with run_manifest.json), DIR/final/ (the trained weights) and
DIR/result.json: every logged loss by step, the final loss on a fixed batch, where it resumed from.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the kit
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/_args.py, also when loaded by path

from _args import number, output_folder, whole_number  # noqa: E402

ROWS = 48  # examples: 12 steps of 4 stay inside one epoch
SEQ_LEN = 32  # tokens per example


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", required=True, type=output_folder("--out", "build/train"), help="the Trainer's output_dir"
    )
    parser.add_argument("--max-steps", type=whole_number("--max-steps", 1, 100_000, "12"), default=12)
    parser.add_argument("--save-steps", type=whole_number("--save-steps", 1, 100_000, "4"), default=4)
    parser.add_argument("--seed", type=whole_number("--seed", 0, 2**32 - 1, "0"), default=0)
    parser.add_argument(
        "--step-delay",
        type=number("--step-delay", 0, 3600, "0.5"),
        default=0.0,
        help="seconds to sleep after each step",
    )
    parser.add_argument("--resume", action="store_true", help="resume from latest_valid_checkpoint(out)")
    parser.add_argument("--qlora", action="store_true", help="4-bit base + LoRA adapter instead of full fine-tuning")
    opts = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # same reductions in every run: bit-identical results on CPU
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from helpers.data import load_course_data
    from helpers.manifest import ManifestCallback
    from helpers.models import load_model
    from helpers.qlora import load_qlora
    from helpers.resume import latest_valid_checkpoint
    from helpers.seeds import seed_everything

    seed_everything(opts.seed)
    if opts.qlora:
        model, tokenizer = load_qlora("embedded", r=4, alpha=8)
    else:
        model, tokenizer = load_model("embedded")
    train = tokenized(load_course_data().select(range(ROWS)), tokenizer)

    class StepDelay(TrainerCallback):  # sleeps, so a test (or you) can kill the run mid-way
        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(opts.step_delay)

    args = TrainingArguments(
        str(opts.out),
        max_steps=opts.max_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=opts.save_steps,
        seed=opts.seed,
        dataloader_num_workers=0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=train, callbacks=[ManifestCallback(dataset=train), StepDelay()]
    )
    resume_from = latest_valid_checkpoint(str(opts.out), model=model) if opts.resume else None
    trainer.train(resume_from_checkpoint=resume_from)
    trainer.save_model(str(Path(opts.out) / "final"))

    model.eval()
    with torch.no_grad():  # the final loss, exactly, on a fixed batch
        batch = train[:8]
        final_loss = model(**{k: torch.tensor(v) for k, v in batch.items()}).loss.item()
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    result = {
        "losses": losses,
        "final_loss": final_loss,
        "resumed_from": resume_from,
        "global_step": trainer.state.global_step,
    }
    (Path(opts.out) / "result.json").write_text(json.dumps(result, indent=2))
    print(f"done: step {trainer.state.global_step}, final loss {final_loss!r}")
    return 0


def tokenized(data, tokenizer):
    """input_ids, attention_mask and labels (padding masked out with -100), SEQ_LEN tokens each."""
    text = [f"{i}\n{r}" for i, r in zip(data["instruction"], data["response"])]
    enc = tokenizer(text, padding="max_length", truncation=True, max_length=SEQ_LEN)
    labels = [
        [t if m else -100 for t, m in zip(ids, mask)] for ids, mask in zip(enc["input_ids"], enc["attention_mask"])
    ]
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})


if __name__ == "__main__":
    sys.exit(main())
