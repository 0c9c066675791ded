"""The quick-check commands for instructors and bank authors (also `python -m helpers quickcheck ...`).

python -m helpers.quickcheck student SRC OUT_DIR                    # student versions of SRC's notebooks
python -m helpers.quickcheck grade SUBMISSION... [--out grades.csv] [--notebook NN|all ...]
        [--format csv|canvas|gradescope|moodle --roster ROSTER.csv [--roster-key COLUMN]
         [--roster-delimiter ,|;|TAB] [--roster-max-rows N] [--assignment NAME | --assignment NN=NAME ...]]
python -m helpers.quickcheck seal BANK.json...                      # hash the plain answers of a bank file
python -m helpers.quickcheck key [--out KEY.md] [--notebook NN|all ...] [--student ID]  # instructors' answer key
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

__all__ = ["main"]


_PROG = "python -m helpers.quickcheck"
_MAX_ROSTER_ROWS_FLAG = 2_000_000  # --roster-max-rows at most: past it, a typo more likely than a class


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Student versions, bulk grading and the answer key of the notebooks' quick checks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    student = sub.add_parser(
        "student", help="make student versions: solutions removed, answers blank, outputs stripped"
    )
    student.add_argument("src", type=Path, help="a folder of .ipynb files (e.g. notebooks/) or one .ipynb")
    student.add_argument("out", type=Path, help="the folder to write the student versions to (not SRC itself)")
    grade = sub.add_parser("grade", help="grade submitted notebooks without running them")
    grade.add_argument("submissions", nargs="+", type=Path, help=".ipynb files and folders of them")
    grade.add_argument(
        "--out",
        type=Path,
        default=Path("grades.csv"),
        help="the CSV to write (default grades.csv); <stem>_feedback/ and <stem>_report.md go next to it",
    )
    grade.add_argument(
        "--notebook",
        action="append",
        metavar="NN",
        help="a notebook you handed out (00 ... 08, or 'all'; repeatable): each file is graded as one of them "
        "and a student's total is out of all of them; default: the notebooks the files are for",
    )
    _add_lms_options(grade)
    seal = sub.add_parser("seal", help="replace the plain answers in bank files by hashes (for bank authors)")
    seal.add_argument("banks", nargs="+", type=Path)
    _add_key_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "student":
        return _student(args.src, args.out)
    if args.command == "grade":
        return _grade(args, argv)
    if args.command == "key":
        return _key(args)
    from helpers.quickcheck.bank import BankError
    from helpers.quickcheck.sealing import seal_file

    for path in args.banks:
        try:
            sealed = seal_file(path)
        except OSError as e:
            print(
                f"error: cannot read {path} ({e.strerror or type(e).__name__}): pass a bank file, e.g. "
                "helpers/quickcheck/bank/03.json",
                file=sys.stderr,
            )
            return 2
        except (ValueError, BankError) as e:
            where = "" if str(path) in str(e) else f"{path}: "  # a BankError names the file already
            print(f"error: {where}{e}", file=sys.stderr)
            return 2
        print(f"{path}: sealed {', '.join(sealed) or 'nothing (no plain answers)'}")
    return 0


def _add_key_parser(sub) -> None:
    key = sub.add_parser(
        "key", help="the instructors' answer key from the bank: every question, its right answer and why"
    )
    key.add_argument("--out", type=Path, help="write it to this Markdown file (e.g. answer_key.md); default: print it")
    key.add_argument(
        "--notebook", action="append", metavar="NN", help="only these notebooks (00 ... 08, or 'all'; repeatable)"
    )
    key.add_argument(
        "--student", metavar="ID", help="add this student's own numbers to the questions that give each their own"
    )


def _key(args: argparse.Namespace) -> int:
    from helpers.quickcheck.escaping import shown_path
    from helpers.quickcheck.key import answer_key, notebook_points

    notebooks, problem = _named_notebooks(args.notebook)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    text = answer_key(notebooks or None, args.student)
    if args.out is None:
        print(text, end="")
        return 0
    out = args.out
    if out.suffix.lower() == ".ipynb" or out.is_dir():
        print(
            f"error: --out {shown_path(out)} must be a Markdown file, not a notebook or a folder: the key is never "
            "written into a handout; use e.g. --out answer_key.md",
            file=sys.stderr,
        )
        return 2
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        print(f"error: could not write {shown_path(out)} ({e.strerror or type(e).__name__})", file=sys.stderr)
        return 2
    points = notebook_points(notebooks or None)
    print(
        f"wrote {shown_path(out)}: notebooks {', '.join(points)}, {sum(points.values()):g} points. For instructors "
        "only: keep it out of the handout folder and of anything students can open"
    )
    return 0


def _named_notebooks(values: list[str] | None) -> tuple[list[str], str]:
    """The notebooks named with --notebook ('all' for every one), or an error line naming the real ones."""
    from helpers.quickcheck.bank import bank_notebooks
    from helpers.quickcheck.escaping import shown

    known = bank_notebooks()
    notebooks = [nb for n in values or [] for nb in (known if n.strip().lower() == "all" else [n.strip()])]
    unknown = [n for n in notebooks if n not in known]
    if unknown:
        return [], f"--notebook {shown(unknown[0], 40)} has no questions; use one of {', '.join(known)}, or all"
    return sorted(set(notebooks)), ""


def _student(src: Path, out: Path) -> int:
    from helpers.quickcheck.escaping import shown, shown_path
    from helpers.quickcheck.handout import HandoutError, write_student_versions

    try:
        made = write_student_versions(src, out)
    except HandoutError as e:
        print("error: " + "\n  ".join(shown(line, 1000) for line in str(e).split("\n")), file=sys.stderr)
        return 2
    for path, notes in made:
        print(f"wrote {shown_path(path)}" + "".join(f"\n  {shown(n, 400)}" for n in notes))
    print(
        f"{len(made)} student version{'s' if len(made) != 1 else ''} in {shown_path(out)}: hand these out "
        "(outputs stripped, solutions removed, quick checks kept)"
    )
    return 0


def _add_lms_options(grade: argparse.ArgumentParser) -> None:
    grade.add_argument(
        "--format",
        choices=["csv", "canvas", "gradescope", "moodle"],
        default="csv",
        help="write --out as this LMS's grade-import file (needs --roster); default csv, the plain gradebook",
    )
    grade.add_argument(
        "--roster",
        type=Path,
        help="the LMS's export of its students (Canvas: the exported gradebook; Gradescope: the roster; "
        "Moodle: a grade export): gives each student's LMS ids, lists who did not submit",
    )
    grade.add_argument(
        "--roster-key",
        metavar="COLUMN",
        help="the roster column that holds the notebooks' student_id (matched ignoring case); default: "
        "canvas 'SIS Login ID', gradescope 'SID', moodle 'ID number', csv 'student_id'",
    )
    grade.add_argument(
        "--roster-delimiter",
        metavar="SEP",
        help="the roster's separator: ',' ';' or a tab (given as 'tab' or $'\\t'); default: the one that splits "
        "its header into the most columns",
    )
    grade.add_argument(
        "--roster-max-rows",
        type=_roster_rows,
        metavar="N",
        help="read a roster of up to N rows (default 50000, a guard against a file that is not a roster)",
    )
    grade.add_argument(
        "--assignment",
        action="append",
        metavar="NAME",
        help="the score column's name in the LMS file (Canvas: 'Name (id)' fills that assignment); for a batch "
        "of several notebooks, NN=NAME per notebook (repeatable); default 'Quick checks NN'",
    )


def _roster_rows(text: str) -> int:
    """An argparse type for --roster-max-rows: a whole number of rows from 1 to _MAX_ROSTER_ROWS_FLAG."""
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        value = 0
    if not 1 <= value <= _MAX_ROSTER_ROWS_FLAG:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of rows from 1 to {_MAX_ROSTER_ROWS_FLAG:,}: pass e.g. --roster-max-rows 60000"
        )
    return value


def _again_with(argv: list[str], flag: str, *values: str) -> str:
    """The command as it was run, `flag` given `values` instead of its own (for a message: run this)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return shlex.join([*_PROG.split(), *kept, *(a for v in values for a in (flag, v))])


def _read_roster(args: argparse.Namespace, argv: list[str]):
    """The roster, or an error line that names the fix (None, message)."""
    from helpers.quickcheck.escaping import shown
    from helpers.quickcheck.roster import MAX_ROSTER_ROWS, RosterError, read_roster

    if args.roster is None:
        if args.format != "csv":
            return None, (
                f"--format {args.format} needs --roster: the LMS's list of students gives each row its LMS ids "
                f"(e.g. --roster roster.csv)"
            )
        if args.roster_key or args.assignment or args.roster_delimiter or args.roster_max_rows:
            return None, (
                "--roster-key, --roster-delimiter, --roster-max-rows and --assignment need --roster ROSTER.csv "
                "(the LMS's export of its students)"
            )
        return None, None
    delimiter = {"tab": "\t", "\\t": "\t"}.get(args.roster_delimiter or "", args.roster_delimiter)
    try:
        return read_roster(
            args.roster, args.format, args.roster_key, delimiter, args.roster_max_rows or MAX_ROSTER_ROWS
        ), None
    except RosterError as e:
        rerun = f"\n  run: {shown(_again_with(argv, *e.option), 2000)}" if e.option else ""
        return None, str(e) + rerun


def _grade(args: argparse.Namespace, argv: list[str]) -> int:
    from helpers.quickcheck.escaping import shown, shown_path
    from helpers.quickcheck.gradebook import course_basis, score_summary
    from helpers.quickcheck.grading import collect, grade

    submissions, out = args.submissions, args.out
    notebooks, problem = _named_notebooks(args.notebook)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    missing = [p for p in submissions if not p.exists()]
    if missing:
        print(f"error: no such file or folder: {shown_path(missing[0])}", file=sys.stderr)
        return 2
    if not collect(submissions)[0]:
        print(f"error: no .ipynb files in {', '.join(map(shown_path, submissions))}", file=sys.stderr)
        return 2
    roster, problem = _read_roster(args, argv)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        run = grade(submissions, out, notebooks=notebooks or None, roster=roster, assignment=args.assignment)
    except ValueError as e:  # an output path or an --assignment that cannot be used: nothing was replaced
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = len(run.submissions)
    print(
        f"graded {n} submission{'s' if n != 1 else ''} in {run.seconds:.1f} s ({len(run.unreadable)} could not be read)"
        f"\nscores: {score_summary(run.submissions, run.issued)} (the report's Scores and Questions sections say more)"
    )
    if len(run.notebooks) > 1:
        print(f"course of notebooks {', '.join(run.notebooks)}: {course_basis(run.notebooks, run.issued)}")
    for s in run.unreadable:
        print(f"  could not read {shown_path(s.path)}: {shown(s.reason, 400)}")
    _print_strays(run, argv)
    print(
        f"gradebook: {shown_path(run.csv_path)}\nfeedback for each student: {shown_path(run.feedback_dir)}/\n"
        f"report: {shown_path(run.report_path)}"
    )
    _print_near_ids(run)
    if run.roster_check is not None:
        c = run.roster_check
        print(
            f"roster: {len(c.matched)} matched, {len(c.missing)} with no submission (blank), "
            f"{len(c.unknown)} id(s) not on the roster, {len(c.no_id)} with no id: see the report's Roster section"
        )
        for s in c.unknown:
            print(f"  not on the roster: {shown(s.student_id, 100)} ({shown_path(s.path)})")
    return 0


def _print_strays(run, argv: list[str]) -> None:
    """Files of notebooks few students handed in, set aside: named once, with the command that grades them too."""
    from helpers.quickcheck.escaping import shown, shown_path

    strays = run.strays
    if not strays or not strays.files:
        return
    for nb, files in strays.files.items():
        one = len(files) == 1
        names = ", ".join(shown_path(s.path.name, 100) for s in files[:5]) + (
            f" and {len(files) - 5} more" if len(files) > 5 else ""
        )
        print(
            f"not graded: {names}, {'a file' if one else f'{len(files)} files'} of notebook {nb}, which "
            f"{strays.students[nb]} of the batch's {strays.everyone} students handed in: taken for "
            f"{'a file' if one else 'files'} that {'was' if one else 'were'} not handed out, adding no column "
            '(the report\'s "Not handed out" section lists them)'
        )
    many = sum(map(len, strays.files.values())) > 1
    wanted = sorted({*run.notebooks, *strays.files})
    print(
        f"  if you handed out notebook {', '.join(strays.files)} too, run: "
        f"{shown(_again_with(argv, '--notebook', *wanted), 2000)}\n"
        f"  if not, remove {'them' if many else 'it'} from the folder: nothing of "
        f"{'them' if many else 'it'} was counted"
    )


def _print_near_ids(run) -> None:
    """Without a roster: ids that read alike (C03, C003), each group on one line; the report says more."""
    from helpers.quickcheck.escaping import shown
    from helpers.quickcheck.near_ids import near_duplicates

    groups = near_duplicates(run.submissions) if run.roster_check is None else []
    if not groups:
        return
    print(
        f"near-duplicate student ids ({len(groups)}), graded as different students, not merged: the report's "
        '"Near-duplicate student ids" section lists their files and what to do'
    )
    for group in groups:
        counts = [len(subs) for _, subs in group.spellings]
        print(
            "  "
            + ", ".join(f"{shown(w, 100)} ({n} file{'s' if n != 1 else ''})" for w, n in zip(group.written(), counts))
        )


if __name__ == "__main__":
    sys.exit(main())
