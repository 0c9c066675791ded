"""Quick checks: questions at the end of every notebook that answer instantly, and bulk grading.

In a notebook (00 ... 08 end with these cells):

    from helpers.quickcheck import check
    # QUICK CHECK q04_2
    answer_q04_2 = None  # your answer
    check("q04_2", answer_q04_2)

For instructors (see the README):

    python -m helpers.quickcheck student notebooks/ handout/           # student versions
    python -m helpers.quickcheck key --out answer_key.md               # the answer key, for you only
    python -m helpers.quickcheck grade submissions/ --out grades.csv   # grade without running them

Modules: `bank` (the questions, one JSON file per notebook), `answers` (an answer's canonical form),
`sealing` (hashed answers, sealed explanations and per-option "why not" feedback; the `seal`
command and the authoring format), `judging` (the one rule that judges an answer), `checks`
(`check`, `ask`), `submissions` (a file to its code cells, safely),
`reading` (answers from a notebook's text, without running it), `safe_eval`, `limits` (the bounds
on one file's work), `grading` (the batch), `grades` (what it produces, per file and per student), `gradebook` (CSV,
feedback, report), `writing` (every output path checked, files written whole), `roster` and `lms`
(an LMS's roster in, its grade-import file out), `near_ids` (ids that read alike, C03 and C003,
flagged when there is no roster), `escaping` (every string that leaves the grader), `handout` and
`blanking` (student versions), `key` (the instructors' answer key, and every point total).
"""

from helpers.quickcheck.checks import ask, check

__all__ = ["ask", "check"]
