"""The job protocol's model (model/protocol.pml), checked by SPIN; and every statement the store
sends, named in the model as one of its actions or as outside the protocol.

Each run copies the model into a temporary folder, generates the verifier (``spin -a``), compiles
it (``gcc``) and searches every state (``./pan``): the model itself under each bound set, where
no invariant may fail, and each broken variant (a preprocessor switch of the same file), where
SPIN must find the named invariant's counter-example and write its trail, which ``spin -t``
replays. model/README.md says what each invariant means. The statements are those of the
snapshot tests/sql/store.sql, read at test time: a statement renamed, added or removed makes
:func:`test_every_statement_is_an_action_or_outside_the_protocol` name it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
MODEL = ROOT / "model" / "protocol.pml"
SNAPSHOT = Path(__file__).parents[1] / "sql" / "store.sql"

#: Safety runs (assertions, end states); -DNOREDUCE: every action touches the shared rows, so the
#: partial-order reduction finds nothing to prune and only costs time.
SAFETY = ("-DSAFETY", "-DNOREDUCE")
#: The LTL run, under weak fairness (pan -a -f) over the model's 6 processes.
LIVENESS = ("-DNOREDUCE", "-DNFAIR=3")
DEPTH = "-m100000"


@dataclass(frozen=True)
class Run:
    """One search: the switches given to spin, and the invariant SPIN must find violated (None:
    the search must find no violation)."""

    switches: tuple[str, ...]
    violated: str | None = None

    @property
    def ltl(self) -> bool:
        return "LIVENESS" in self.switches


RUNS = {
    # The model under each bound set (model/protocol.pml, "Bounds").
    "three jobs": Run(()),
    "faults": Run(("FAULTS",)),
    "operator": Run(("OPERATOR",)),
    "liveness": Run(("LIVENESS",)),
    # The broken variants: each must break its invariant.
    "fence without the attempt": Run(("BROKEN_FENCE",), "fenced_write_by_holder"),
    "effect outside the completion": Run(("BROKEN_EFFECT",), "one_effect_per_job"),
    "claim ignoring the limit": Run(("BROKEN_LIMIT",), "limit_held_by_lanes"),
    "jobs taken together run at once": Run(("BROKEN_TOGETHER",), "limit_held_by_lanes"),
    "step recorded without the fence": Run(("BROKEN_STEP",), "recorded_step_never_reruns"),
    "reaper that deletes": Run(("BROKEN_LOST", "LIVENESS"), "no_job_lost"),
    "hand-back that spends the budget": Run(("BROKEN_DEAD", "FAULTS"), "dead_exactly_at_max_attempts"),
    "reaper that does not charge": Run(("BROKEN_CHARGE",), "dead_exactly_at_max_attempts"),
    # What the protocol does not promise, and why (model/README.md).
    "handlers past their lease": Run(("STRICT_LIMIT",), "limit_held_by_lanes"),
    "steps of a stale run": Run(("STRICT_STEPS",), "recorded_step_never_reruns"),
}


def tool(name: str) -> str:
    """The path of ``name``, or a failure saying how to install it (never a skip: the model is
    part of the suite)."""
    path = shutil.which(name)
    if path is None:
        package = "spin" if name == "spin" else "gcc"
        pytest.fail(f"{name} is not installed: the protocol's model needs it (apt-get install {package})")
    return path


def run(args: list[str], cwd: Path) -> str:
    """Run a command in ``cwd``; its output (stdout and stderr), or a failure that shows it."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=110, check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited with {done.returncode}:\n{output}")
    return output


def verify(switches: tuple[str, ...], folder: Path) -> str:
    """Generate, compile and run the verifier for the model with ``switches``, in ``folder``;
    pan's report."""
    spin, gcc = tool("spin"), tool("gcc")
    shutil.copy(MODEL, folder / MODEL.name)
    defines = [f"-D{switch}" for switch in switches]
    run([spin, *defines, "-a", MODEL.name], folder)
    ltl = "LIVENESS" in switches
    # A search that must fail stops at its first counter-example: compiling it fast saves more.
    optimize = "-O0" if any(s.startswith(("BROKEN_", "STRICT_")) for s in switches) else "-O2"
    run([gcc, optimize, *(LIVENESS if ltl else SAFETY), "-o", "pan", "pan.c"], folder)
    return run(["./pan", DEPTH, *(["-a", "-f"] if ltl else [])], folder)


def errors(report: str) -> int:
    match = re.search(r"errors: (\d+)", report)
    assert match, f"pan's report has no error count:\n{report}"
    return int(match.group(1))


@pytest.mark.parametrize("name", list(RUNS))
def test_the_model(name: str, tmp_path: Path) -> None:
    spec = RUNS[name]
    report = verify(spec.switches, tmp_path)
    assert "max search depth too small" not in report, report
    trail = tmp_path / f"{MODEL.name}.trail"
    if spec.violated is None:
        assert errors(report) == 0, f"{name}: an invariant failed:\n{report}"
        assert not trail.exists()
        assert "Full statespace search" in report
        return
    assert errors(report) == 1, f"{name}: SPIN found no violation of {spec.violated}:\n{report}"
    assert trail.exists(), f"{name}: pan wrote no trail:\n{report}"
    replay = run([tool("spin"), *(f"-D{s}" for s in spec.switches), "-t", MODEL.name], tmp_path)
    if spec.ltl:
        assert re.search(rf"never claim\s+\+ \({spec.violated}\)", report), report
        assert "acceptance cycle" in report, report
        assert "<<<<<START OF CYCLE>>>>>" in replay, replay
    else:
        assert f"assertion violated {spec.violated} " in report, report
        assert f"text of failed assertion: assert({spec.violated})" in replay, replay


def snapshot_statements() -> list[str]:
    """The statements of the snapshot, by the name each is sent under (a list of statements,
    ``_recount[0]`` ..., by the list's name)."""
    text = SNAPSHOT.read_text(encoding="utf-8")
    headings = re.findall(r"^-- (\S+)$", text, flags=re.MULTILINE)
    unread = [heading for heading in headings if not re.fullmatch(r"_\w+(\[\d+\])?", heading)]
    assert headings and not unread, (
        f"{SNAPSHOT.name}: expected a '-- _name' line before each statement; could not read {unread or 'any'}"
    )
    return list(dict.fromkeys(re.sub(r"\[\d+\]$", "", heading) for heading in headings))


def model_actions() -> dict[str, list[str]]:
    """The statements each action of the model names, by the action: its comment ``action
    <name> -- sql: _a _b`` and the lines after it that hold only statement names."""
    text = MODEL.read_text(encoding="utf-8")
    actions: dict[str, list[str]] = {}
    for match in re.finditer(r"action (\w+) -- sql: (.*(?:\n\s*\*(?:\s+_\w+)+\s*$)*)", text, flags=re.MULTILINE):
        assert match.group(1) not in actions, f"action {match.group(1)} is named twice"
        actions[match.group(1)] = re.findall(r"_\w+", match.group(2))
    return actions


def outside_the_protocol() -> dict[str, str]:
    """The model's list "outside": each statement that changes no job's state in the protocol,
    and why."""
    text = MODEL.read_text(encoding="utf-8")
    block = text[text.index("/* outside --") :]
    block = block[: block.index("*/")]
    listed = dict(re.findall(r"^\s*\*\s+(_\w+)\s+(.*\S)\s*$", block, flags=re.MULTILINE))
    assert listed, f"{MODEL.name}: the list 'outside' names no statement"
    return listed


def test_every_statement_is_an_action_or_outside_the_protocol() -> None:
    statements = snapshot_statements()
    named: dict[str, list[str]] = {}
    for action, names in model_actions().items():
        for name in names:
            named.setdefault(name, []).append(f"action {action}")
    for name in outside_the_protocol():
        named.setdefault(name, []).append("outside")
    unmapped = [name for name in statements if name not in named]
    stale = sorted(set(named) - set(statements))
    twice = {name: places for name, places in named.items() if len(places) > 1}
    problems = []
    if unmapped:
        problems.append(
            f"statements of tests/sql/store.sql that model/protocol.pml does not name: {unmapped} (add each to the "
            "'sql:' comment of the action it stands for, or to the list 'outside' with why)"
        )
    if stale:
        problems.append(f"statements model/protocol.pml names that the store no longer sends: {stale}")
    if twice:
        problems.append(f"statements named in more than one place of model/protocol.pml: {twice}")
    assert not problems, "\n".join(problems)


def test_each_statement_outside_the_protocol_says_why() -> None:
    short = [name for name, why in outside_the_protocol().items() if len(why.split()) < 2]
    assert not short, f"statements outside the protocol without a reason: {short}"
