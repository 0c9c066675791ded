"""The rows `helpers.data.chat_dataset` trains on, read and checked before any tokenizing (notebook 08).

Private to the package: `helpers.data` re-exports the two exceptions a caller meets. What is accepted:

- `rows`: a `datasets.Dataset`, a list of dicts (one a row), or a dict of lists (one a column, as
  `Dataset.from_dict` takes them); other columns are not read;
- one shape of row: "instruction" and "response" (one question, its answer), or "messages" (the chat
  format of the Hub's chat datasets): [{"role", "content"}, ...] with optional system turns first,
  then user and assistant turns in turn, ending with the assistant's. Several assistant turns all
  train. Other keys of a turn are not passed to the chat template;
- every text (instruction, response, each turn's content) a str with something besides whitespace:
  an empty answer would train the model to answer nothing, so such a row is refused, never dropped.

Each refusal names the row as the caller writes it (`rows[3]['response']`), the value's type and a
shortened repr, and the fix in the caller's own indices.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ChatDataError", "SeqLenTooShort", "check_text", "read_conversations"]

PAIR = ("instruction", "response")
MESSAGES = "messages"
# columns of other datasets that hold the same thing, suggested as renames: Alpaca, Dolly, Q&A sets
_ALIASES = {
    "instruction": ("prompt", "question", "query", "input"),
    "response": ("completion", "answer", "output"),
    MESSAGES: ("conversations", "conversation", "chat"),
}
_LISTED = 10  # bad rows named by index in one message


class ChatDataError(ValueError):
    """Rows `chat_dataset` cannot train on, said before any tokenizing: the row, the column, the fix."""


class SeqLenTooShort(ChatDataError):
    """No answer token would be left within `seq_len`; `shortest_prompt` tokens is what it must exceed."""

    def __init__(self, message: str, seq_len: int, shortest_prompt: int, longest_prompt: int):
        super().__init__(message)
        self.seq_len, self.shortest_prompt, self.longest_prompt = seq_len, shortest_prompt, longest_prompt


def describe(value) -> str | None:
    """What is wrong with `value` as a text to train on ("None", "a float: 3.5"), or None when it is fine."""
    if isinstance(value, str):
        return None if value.strip() else ("an empty str" if not value else f"only whitespace: {value!r}")
    return "None" if value is None else typed(value)


def typed(value) -> str:
    """`value`'s type and its repr, shortened: "a float: 3.5", "an int: 42", "a str: 'Hello...'"."""
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}: {shown}"


def check_text(name: str, value) -> None:
    """Refuse `value` as the argument `name` (a direct call to chat_features or chat_prompt) unless it is text."""
    problem = describe(value)
    if problem:
        raise ChatDataError(f"{name} is {problem}; it should be a str with some text in it")


def read_conversations(rows, tokenizer) -> list[list[dict]]:
    """`rows` as conversations ([{"role", "content"}, ...] each), every row checked; ChatDataError otherwise."""
    kind, columns, records = _records(rows)
    if not records:
        raise ChatDataError(
            f"rows is empty (0 rows{f', columns {columns}' if columns else ''}): nothing to train on; check the split "
            "or the filter that made it"
        )
    shape = _shape(kind, columns)
    read = _pair_row if shape == PAIR else _messages_row
    conversations, problems = [], []
    for i, record in enumerate(records):
        turns, problem = read(record, lambda *keys, i=i: _at(kind, i, *keys))
        conversations.append(turns)
        if problem:
            problems.append((i, problem))
    if problems:
        raise ChatDataError(_bad_rows_message(kind, len(records), problems, shape))
    _check_system_turns(tokenizer, conversations, kind)
    return conversations


def _records(rows):
    """("dataset" | "list" | "dict", column names, the rows as dicts) for each input that is accepted."""
    from datasets import Dataset, DatasetDict

    if isinstance(rows, DatasetDict):
        raise ChatDataError(
            f"rows is a DatasetDict of splits {list(rows)}: pass one split, e.g. rows[{next(iter(rows), 'train')!r}]"
        )
    if isinstance(rows, Dataset):
        return "dataset", rows.column_names, rows.to_list()
    if isinstance(rows, (list, tuple)):
        odd = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
        if odd:
            raise ChatDataError(
                f"rows[{odd[0]}] is {typed(rows[odd[0]])}; each row of a list should be a dict such "
                f"as {{'instruction': ..., 'response': ...}} ({len(odd)} of {len(rows)} rows are not)"
            )
        return "list", list(dict.fromkeys(k for r in rows for k in r)), list(rows)
    if isinstance(rows, dict):  # columns: lists, tuples, a Dataset's columns (ds["x"]), numpy arrays
        columns = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in rows.items()}
        wrong = [k for k, v in columns.items() if not isinstance(v, Sequence) or isinstance(v, (str, bytes))]
        lengths = {k: len(v) for k, v in columns.items() if k not in wrong}
        if wrong or len(set(lengths.values())) > 1:
            found = f"rows[{wrong[0]!r}] is {typed(rows[wrong[0]])}" if wrong else f"column lengths {lengths}"
            raise ChatDataError(f"a dict of rows should hold columns, lists of one length each; {found}")
        return "dict", list(columns), [dict(zip(columns, values)) for values in zip(*columns.values())]
    raise ChatDataError(
        f"rows is a {type(rows).__name__}; chat_dataset takes a datasets.Dataset (one split), a list of dicts or a "
        "dict of lists (a pandas DataFrame: datasets.Dataset.from_pandas(df); a streamed IterableDataset: "
        "datasets.Dataset.from_list(list(rows.take(1000))))"
    )


def _shape(kind, columns):
    """PAIR or MESSAGES, from the column names; a refusal that says which columns there are otherwise."""
    pair, messages = set(PAIR) <= set(columns), MESSAGES in columns
    if pair and messages:
        raise ChatDataError(
            f"rows has both 'instruction'/'response' and 'messages' columns ({columns}): keep one shape, e.g. "
            + (
                "rows = rows.remove_columns('messages')"
                if kind == "dataset"
                else "drop the 'messages' key of every row"
            )
        )
    if pair or messages:
        return PAIR if pair else MESSAGES
    renames = {alias: need for need in (*PAIR, MESSAGES) for alias in _ALIASES[need] if alias in columns}
    renames = {a: n for a, n in renames.items() if n not in columns and list(renames.values()).count(n) == 1}
    hint = ""
    if renames:
        hint = f"; rename yours, e.g. rows = rows.rename_columns({renames})" if kind == "dataset" else ""
        hint = hint or f"; rename yours: {', '.join(f'{a!r} -> {n!r}' for a, n in renames.items())}"
    raise ChatDataError(
        f"rows has columns {columns}, and chat_dataset needs 'instruction' and 'response' (a question and its answer "
        "a row) or 'messages' (a list of {'role': ..., 'content': ...} turns)" + hint
    )


def _pair_row(record, at):
    turns = [{"role": "user", "content": record.get(PAIR[0])}, {"role": "assistant", "content": record.get(PAIR[1])}]
    for column in PAIR:
        if column not in record:
            return turns, f"{at()} has no {column!r} (its keys: {list(record)})"
        problem = describe(record[column])
        if problem:
            return turns, f"{at(column)} is {problem}"
    return turns, None


def _messages_row(record, at):
    """(the turns, role and content only, or None; what is wrong with them, or None)."""
    turns = record.get(MESSAGES)
    if MESSAGES not in record:
        return None, f"{at()} has no 'messages' (its keys: {list(record)})"
    if not isinstance(turns, (list, tuple)) or not turns:
        shown = "an empty list" if isinstance(turns, (list, tuple)) else describe(turns) or typed(turns)
        return None, f"{at(MESSAGES)} is {shown}, where a list of turns is needed"
    systems = next((j for j, t in enumerate(turns) if not (isinstance(t, dict) and t.get("role") == "system")), 0)
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
            keys = f"keys {list(turn)}" if isinstance(turn, dict) else describe(turn)
            sharegpt = (
                " (ShareGPT's 'from'/'value' turns need renaming)" if isinstance(turn, dict) and "from" in turn else ""
            )
            return None, f"{at(MESSAGES, j)} is not a {{'role', 'content'}} turn ({keys}){sharegpt}"
        want = "system" if j < systems else ("user", "assistant")[(j - systems) % 2]
        if turn["role"] != want:
            return None, f"{at(MESSAGES, j, 'role')} is {turn['role']!r} where {want!r} must come"
        problem = describe(turn["content"])
        if problem:
            return None, f"{at(MESSAGES, j, 'content')} is {problem}"
    if turns[-1]["role"] != "assistant":
        return None, f"{at(MESSAGES)} ends with a {turns[-1]['role']!r} turn, with no assistant answer after it"
    return [{"role": t["role"], "content": t["content"]} for t in turns], None


def _bad_rows_message(kind, n_rows, problems, shape):
    """The first problem in full, how many rows have one, and how to leave them out."""
    first = problems[0][1]
    need = (
        "each row needs 'instruction' (the question) and 'response' (the answer to train on) as non-empty text"
        if shape == PAIR
        else "each row's 'messages' go: system turns if any, then 'user' and 'assistant' in turn, ending with the "
        "assistant's answer; each 'content' non-empty text"
    )
    bad = [i for i, _ in problems]
    listed = ", ".join(map(str, bad[:_LISTED])) + (", ..." if len(bad) > _LISTED else "")
    drop = set(bad)
    fix = {
        "dataset": f"rows = rows.select([i for i in range(len(rows)) if i not in {drop}])",
        "list": f"rows = [r for i, r in enumerate(rows) if i not in {drop}]",
        "dict": f"rows = {{k: [v for i, v in enumerate(vs) if i not in {drop}] for k, vs in rows.items()}}",
    }[kind]
    if len(bad) > _LISTED:  # too many to list: a test each row passes
        test = "ok = lambda r: all(isinstance(r.get(c), str) and r[c].strip() for c in ('instruction', 'response'))"
        fix = {"dataset": f"{test}; rows = rows.filter(ok)", "list": f"{test}; rows = [r for r in rows if ok(r)]"}.get(
            kind, "keep the rows that pass such a test"
        )
        fix = fix if shape == PAIR else "keep the rows whose turns pass such a test (rows.filter for a Dataset)"
    if len(bad) == 1:
        return f"{first}; {need}. Fix row {bad[0]} or leave it out: {fix}"
    count = f"{len(bad)} of {n_rows} rows have such a problem (rows {listed})"
    return f"{first}; {need}. {count}; fix or leave them out: {fix}"


def _at(kind, i, *keys):
    """How the caller writes row i's value at `keys`: rows[3]['response'] (rows['response'][3] for a dict)."""
    if kind == "dict" and keys:
        keys = (keys[0], i, *keys[1:])
        return "rows" + "".join(f"[{k!r}]" for k in keys)
    return f"rows[{i}]" + "".join(f"[{k!r}]" for k in keys)


def _check_system_turns(tokenizer, conversations, kind):
    """Refuse system turns when the chat template leaves them out or raises on them (Gemma's, Mistral's)."""
    first = next((i for i, turns in enumerate(conversations) if turns[0]["role"] == "system"), None)
    if first is None:
        return
    probe = [{"role": "system", "content": "SYSTEM-PROBE"}, {"role": "user", "content": "q"}]
    try:
        fits = "SYSTEM-PROBE" in tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        why = "it leaves the system text out"
    except Exception as e:  # jinja's TemplateError or the template's raise_exception: either says no
        fits, why = False, f"it raises {type(e).__name__}: {e}"
    if not fits:
        name = getattr(tokenizer, "name_or_path", "") or "this model"
        raise ChatDataError(
            f"{_at(kind, first, MESSAGES, 0)} is a system turn, and the chat template of {name!r} has no place for one "
            f"({why}): put its text at the start of the first user turn, or drop the system turns"
        )
