"""Time the quick-check grader on a class-sized batch of synthetic submissions.

    python scripts/bench_quickcheck.py              # 500 submissions of notebook 00
    python scripts/bench_quickcheck.py --n 2000 --keep out/   # more, and keep the files and the CSV

Each submission is notebook 00 as a student downloads it from Colab: outputs in every code
cell, one plot (a 60 KB base64 PNG, as matplotlib writes), Colab's widget state, receipts, and
answers drawn at random: right, wrong, blank, written as a computed name (unreadable), or with
the quick-check cells edited. One in twenty is damaged (cut off) and one in twenty is not a
notebook at all. It prints the figure the issue asks for: seconds for the batch, submissions/s.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.quickcheck.bank import load_bank, params_for  # noqa: E402
from helpers.quickcheck.grading import grade  # noqa: E402
from helpers.quickcheck.judging import format_receipt, judge  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "00_where_to_get_gpus.ipynb"


def candidates(q, student_id: str) -> list[str]:
    """Answers a student might write, as source text; which are right is for the grader to find."""
    if q.kind == "choice":
        return [repr(k) for k in q.choices] + ([repr("".join(sorted(q.choices)[1:]))] if q.multiple else [])
    if q.personal:
        memory = params_for(q, student_id).get("memory_gb", 16)
        return [f"{memory} / 0.52", f"{memory * 2}", "12.5"]
    return ["16", "8", "12", "32"]


def make_submission(base: dict, i: int, rng: random.Random) -> str | bytes:
    if i % 20 == 19:
        return rng.choice([b"%PDF-1.7 not a notebook", "<html>exported page</html>", ""])
    student_id = f"s{i:05d}"
    nb = json.loads(json.dumps(base))
    nb["metadata"]["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {f"w{k}": {"model_name": "HTMLModel", "state": {"value": "x" * 200}} for k in range(20)}
        }
    }
    plot = base64.b64encode(rng.randbytes(45_000)).decode()
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]).replace('student_id = ""', f'student_id = "{student_id}"')
        outputs = [{"output_type": "stream", "name": "stdout", "text": ["measured figure: 1.234\n"] * 40}]
        for q in load_bank("00"):
            if f"answer_{q.id} = None" in src and rng.random() < 0.9:
                answer = rng.choice(candidates(q, student_id) + (["bytes_pp"] if rng.random() < 0.1 else []))
                src = src.replace(f"answer_{q.id} = None", f"answer_{q.id} = {answer}")
                if answer != "bytes_pp":
                    verdict = judge(q, eval(answer), student_id)  # the synthetic answer is ours, not a student's
                    outputs.append(
                        {
                            "output_type": "stream",
                            "name": "stdout",
                            "text": [format_receipt(verdict, rng.randint(1, 4)) + "\n"],
                        }
                    )
        if "bytes_per_param" in src:
            outputs.append(
                {"output_type": "display_data", "metadata": {}, "data": {"image/png": plot, "text/plain": "<Figure>"}}
            )
        cell["source"], cell["outputs"] = src.splitlines(keepends=True), outputs
        cell["metadata"] = {"colab": {"base_uri": "https://localhost:8080/"}, "outputId": f"o{i}"}
    if i % 20 == 7:  # edited: the quick-check cells moved to the top
        qc = [c for c in nb["cells"] if "QUICK CHECK" in "".join(c["source"])]
        nb["cells"] = qc + [c for c in nb["cells"] if c not in qc]
    text = json.dumps(nb, indent=1)
    return text[: len(text) * 9 // 10] if i % 20 == 13 else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="number of submissions (default 500)")
    parser.add_argument("--keep", type=Path, help="write the submissions and results here instead of a temp dir")
    args = parser.parse_args(argv)
    rng = random.Random(0)
    base = json.loads(NOTEBOOK.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        subs = root / "submissions"
        subs.mkdir(parents=True, exist_ok=True)
        for i in range(args.n):
            content = make_submission(base, i, rng)
            path = subs / f"student_{i:05d}.ipynb"
            path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        size = sum(p.stat().st_size for p in subs.iterdir())
        start = time.perf_counter()
        run = grade([subs], root / "grades.csv")
        seconds = time.perf_counter() - start
        print(
            f"graded {len(run.submissions)} submissions ({size / 2**20:.0f} MiB, "
            f"{len(run.unreadable)} unreadable) in {seconds:.2f} s: {len(run.submissions) / seconds:.0f} submissions/s"
            f" (the issue asks for 500 in under 10 s)"
        )
    return 0 if seconds < 10 * args.n / 500 else 1


if __name__ == "__main__":
    sys.exit(main())
