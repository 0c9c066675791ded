"""What a student sees in a browser: notebooks 00, 01 and 03 run in JupyterLab under headless Chromium.

`make e2e` runs this after `make test` (and `.ci/run` calls it). Each test opens a notebook as a
student would, runs every cell from the menu's "Run All", and asserts on what the page renders:
the environment banner, a quick check answered wrong and then right, the live memory readout
refreshing in one output area while the Trainer trains (not a stream of lines, and no Trainer
`{'loss': ...}` dicts around it), the plots as images, and notebook 01's memory planner redrawing its
bill and verdict when two of its sliders are moved. Screenshots go to build/e2e/.

The notebooks are driven through JupyterLab's own commands (`window.jupyterapp`, exposed by a
server flag): the same commands the menus and the Shift+Enter key run.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time

import pytest

NOTEBOOK_TIMEOUT_S = 600  # a whole notebook on a loaded 2-core machine; about 1 minute idle
READOUT = re.compile(r"step (\d+)/(\d+)")  # the live readout's first words, e.g. "step 10/20 | loss ..."

# Every distinct text the page renders in an output, recorded as it appears: the readout refreshes
# faster than a test can poll, so the page keeps the history itself.
WATCH_OUTPUTS = """
window.__seen = [];
new MutationObserver(() => {
  for (const node of document.querySelectorAll('.jp-OutputArea-output')) {
    const text = node.innerText;
    if (text && window.__seen[window.__seen.length - 1] !== text) window.__seen.push(text);
  }
}).observe(document.body, {subtree: true, childList: true, characterData: true});
"""

CELLS = """
const widget = window.jupyterapp.shell.currentWidget;
return widget.content.widgets.map((cell, index) => ({
  index,
  type: cell.model.type,
  source: cell.model.sharedModel.getSource(),
  count: cell.model.type === 'code' ? cell.model.executionCount : null,
  running: (cell.node.querySelector('.jp-InputPrompt') || {innerText: ''}).innerText.includes('*'),
  outputs: cell.model.type === 'code' ? cell.model.outputs.toJSON() : [],
  rendered: Array.from(cell.node.querySelectorAll('.jp-OutputArea-output')).map(o => o.innerText),
  images: Array.from(cell.node.querySelectorAll('.jp-OutputArea-output img'))
    .filter(img => img.src.startsWith('data:image/png') && img.naturalWidth > 0).length,
}));
"""


class Notebook:
    """One notebook open in the browser, driven through JupyterLab's commands."""

    def __init__(self, driver, lab, name: str, screenshots):
        base, token, _ = lab
        self.driver, self.name, self.screenshots = driver, name, screenshots
        driver.get(f"{base}/lab/tree/{name}?token={token}")
        self._wait(self._kernel_idle, 180, "the notebook to open and its kernel to start")
        driver.execute_script(WATCH_OUTPUTS)

    def _kernel_idle(self) -> bool:
        return bool(
            self.driver.execute_script(
                """
                const app = window.jupyterapp;
                const widget = app && app.shell.currentWidget;
                const kernel = widget && widget.sessionContext && widget.sessionContext.session
                    && widget.sessionContext.session.kernel;
                return !!(kernel && kernel.status === 'idle' && widget.context.path.endsWith(arguments[0]));
                """,
                self.name,
            )
        )

    def _wait(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                self.screenshot("timeout")
                pytest.fail(f"{self.name}: waited {timeout:.0f} s for {what}; see {self.screenshots}")
            time.sleep(0.5)

    def cells(self) -> list[dict]:
        return self.driver.execute_script(CELLS)

    def _settled(self) -> bool:
        """The kernel is idle and no cell is queued or running, twice in a row half a second apart."""
        for _ in range(2):
            if not self._kernel_idle() or any(c["running"] for c in self.cells()):
                return False
            time.sleep(0.5)
        return True

    def run_all(self) -> list[dict]:
        self.driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
        time.sleep(1)
        self._wait(self._settled, NOTEBOOK_TIMEOUT_S, "Run All to finish")
        cells = self.cells()
        errors = [o for c in cells for o in c["outputs"] if o.get("output_type") == "error"]
        assert not errors, f"{self.name}: a cell raised {errors[0]['ename']}: {errors[0]['evalue']}"
        unrun = [c["index"] for c in cells if c["type"] == "code" and c["count"] is None]
        assert not unrun, f"{self.name}: cells {unrun} never ran"
        return cells

    def run_cell(self, index: int, source: str) -> dict:
        """Replace cell `index`'s text as a student would type it, run it (Shift+Enter), return it."""
        before = self.cells()[index]["count"]
        self.driver.execute_script(
            """
            const notebook = window.jupyterapp.shell.currentWidget.content;
            notebook.activeCellIndex = arguments[0];
            notebook.widgets[arguments[0]].model.sharedModel.setSource(arguments[1]);
            window.jupyterapp.commands.execute('notebook:run-cell');
            """,
            index,
            source,
        )
        self._wait(lambda: self.cells()[index]["count"] not in (None, before) and self._settled(), 60, "the cell")
        return self.cells()[index]

    def seen(self) -> list[str]:
        return self.driver.execute_script("return window.__seen;")

    def screenshot(self, what: str, index: int | None = None) -> None:
        path = self.screenshots / f"{self.name.split('_')[0]}_{what}.png"
        if index is None:
            self.driver.save_screenshot(str(path))
            return
        node = self.driver.execute_script(
            "const c = window.jupyterapp.shell.currentWidget.content.widgets[arguments[0]];"
            "c.node.scrollIntoView(); return c.node;",
            index,
        )
        node.screenshot(str(path))


def _text(cell: dict) -> str:
    return "\n".join(cell["rendered"])


def _notebook_name(lab, prefix: str) -> str:
    return next(p.name for p in sorted(lab[2].glob(f"{prefix}_*.ipynb")))


def _expected_check_output(question_id: str, answer) -> str:
    """What the kit's own check() prints for this answer, run here: the page must show the same."""
    from helpers.quickcheck import check

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        check(question_id, answer)
    return printed.getvalue()


def _right_and_wrong(question_id: str) -> tuple[str, str]:
    """A right and a wrong letter for a single-choice question, found by asking the kit's judge."""
    from helpers.quickcheck.bank import get_question
    from helpers.quickcheck.judging import CORRECT, judge

    question = get_question(question_id)
    right = [letter for letter in question.choices if judge(question, letter).status == CORRECT]
    assert len(right) == 1, f"{question_id} is not a single-choice question: {right}"
    return right[0], next(letter for letter in question.choices if letter != right[0])


def test_notebook_00_banner_plot_and_a_quick_check_answered_wrong_then_right(driver, lab, screenshots):
    from helpers.env import describe

    notebook = Notebook(driver, lab, _notebook_name(lab, "00"), screenshots)
    cells = notebook.run_all()
    notebook.screenshot("after_run_all")

    banner = describe().summary().splitlines()[0]  # the same machine, described by the kit here
    shown = [_text(c) for c in cells if c["rendered"]]
    assert any(banner in text for text in shown), f"00 does not show the banner {banner!r}; it shows {shown[:4]}"

    index, question_id = next(
        (c["index"], m.group(1)) for c in cells if (m := re.match(r"# QUICK CHECK (q\w+)", c["source"]))
    )
    source = cells[index]["source"]
    unanswered = re.search(rf"answer_{question_id} = None", source)
    assert unanswered, f"00's first quick check does not start unanswered:\n{source}"
    right, wrong = _right_and_wrong(question_id)

    for letter, verdict in ((wrong, "wrong"), (right, "right")):
        cell = notebook.run_cell(index, source.replace(unanswered.group(0), f'answer_{question_id} = "{letter}"'))
        notebook.screenshot(f"quick_check_{verdict}", index)
        expected = _expected_check_output(question_id, letter)
        feedback = [line for line in expected.splitlines() if line.strip() and "attempt" not in line.lower()]
        shown = _text(cell)
        missing = [line for line in feedback if line.strip() not in shown]
        assert not missing, f"answered {verdict} ({letter!r}), the page lacks {missing} in:\n{shown}"
    wrong_text = _expected_check_output(question_id, wrong)
    assert wrong_text != _expected_check_output(question_id, right), "a wrong and a right answer read the same"
    assert sum(c["images"] for c in cells) >= 1, "00 renders no plot image"


def test_notebook_03_live_readout_refreshes_in_one_output_area(driver, lab, screenshots):
    notebook = Notebook(driver, lab, _notebook_name(lab, "03"), screenshots)
    cells = notebook.run_all()
    notebook.screenshot("after_run_all")

    training = [c for c in cells if any(READOUT.match(t) for t in c["rendered"])]
    assert training, "03 shows no live readout (a 'step N/M | ...' output)"
    cell = training[0]
    notebook.screenshot("live_readout", cell["index"])
    readouts = [t for t in cell["rendered"] if READOUT.match(t)]
    assert len(readouts) == 1, f"the readout should refresh one output area; it printed {len(readouts)}:\n{readouts}"
    printed_dicts = [t for t in cell["rendered"] if "{'loss'" in t or "{'train_runtime'" in t]
    assert not printed_dicts, f"the Trainer's own log dicts print around the readout:\n{printed_dicts}"

    steps = [int(m.group(1)) for t in notebook.seen() if (m := READOUT.match(t))]
    assert len(set(steps)) >= 2 and steps == sorted(steps), f"the readout did not refresh in place: {steps}"
    final = READOUT.match(readouts[0])
    assert final.group(1) == final.group(2), f"the readout stopped before the last step: {readouts[0]!r}"
    (screenshots / "03_readout_history.json").write_text(json.dumps(steps))
    assert sum(c["images"] for c in cells) >= 1, "03 renders no plot image"


PLANNER = """
const box = [...document.querySelectorAll('.widget-vbox')]
  .find(b => b.querySelector('.widget-output') && b.innerText.includes('per-device batch'));
if (!box) return null;
const out = box.querySelector('.widget-output');
const img = out.querySelector('img');
return {
  text: out.innerText,
  image: img && img.naturalWidth > 0 ? img.src : null,
  readouts: [...box.querySelectorAll('.widget-readout')].map(r => r.innerText.trim()),
};
"""


def test_notebook_01_planner_redraws_the_bill_when_a_slider_moves(driver, lab, screenshots):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    notebook = Notebook(driver, lab, _notebook_name(lab, "01"), screenshots)
    notebook.run_all()
    notebook._wait(lambda: (driver.execute_script(PLANNER) or {}).get("image"), 60, "the planner's first plot")
    before = driver.execute_script(PLANNER)
    assert before["text"].strip().startswith("fits"), f"the planner's starting job should fit a T4: {before['text']}"
    assert "\nassumes: the Hugging Face Trainer" in before["text"], "the stack the verdict assumes is on screen"
    notebook.screenshot("planner_before")

    for label in ("per-device batch", "seq_len"):  # both to their largest: 64 x 8192 tokens
        handle = driver.find_element(
            By.XPATH,
            f"//div[contains(@class, 'widget-slider')][.//label[normalize-space()='{label}']]"
            "//div[contains(@class, 'noUi-handle')]",
        )
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", handle)
        handle.click()
        handle.send_keys(Keys.END)

    def redrawn():
        now = driver.execute_script(PLANNER)
        return now["image"] and now["image"] != before["image"] and now["text"] != before["text"] and now

    notebook._wait(redrawn, 60, "the planner to redraw after the sliders moved")
    after = driver.execute_script(PLANNER)
    notebook.screenshot("planner_after")
    assert after["readouts"][:2] == ["64", "8192"], after["readouts"]
    assert after["text"].strip().startswith("does not fit"), after["text"]
    assert "What makes it fit, cheapest first" in after["text"], "a job that does not fit gets the ladder"
