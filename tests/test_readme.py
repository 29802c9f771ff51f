"""The README is executable documentation: its code runs as written and shows what it says.

Every ```python block runs, in order, in one fresh kernel on this machine (no GPU, no
DEVLAB_SIMULATE_GPUS), as a reader pasting them into a notebook would run them; a ```text
block right after a block is what that block shows (`...` stands for what varies, spaces and
line breaks are equivalent). Every ```bash block runs too, line by line in the folder the
notebook ran in, unless its first line says why not: `# Not run by the README test: <why>.`
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from nbutil import ROOT, errors, run_cells, text

# One worker runs this module: its tests share one expensive module fixture, which
# each worker would otherwise build again.
pytestmark = [pytest.mark.notebook, pytest.mark.xdist_group("test_readme")]

README = ROOT / "README.md"
NOT_RUN = re.compile(r"^# Not run by the README test: (\S.*)$")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n(?:\s*\n)*", re.S | re.M)
_CHECKER = doctest.OutputChecker()
_OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    lang: str
    code: str
    line: int  # where it starts in README.md
    shows: str | None = None  # the ```text block after it

    @property
    def not_run(self) -> str | None:
        """Why the block does not run here, as its first line says, or None."""
        match = NOT_RUN.match(self.code.splitlines()[0])
        return match[1] if match else None


def blocks(readme: str) -> list[Block]:
    """The README's code blocks, each with the text block that follows it, if any."""
    found: list[Block] = []
    at = 0
    for match in _FENCE.finditer(readme):
        lang, code = match[1], match[2]
        line = readme.count("\n", 0, match.start()) + 1
        if lang == "text" and found and match.start() == at:
            found[-1].shows = code
        else:
            found.append(Block(lang, code, line))
        at = match.end()
    return found


def shows(block: Block, got: str) -> bool:
    return _CHECKER.check_output(block.shows or "", got, _OPTIONS)


@pytest.fixture(scope="module")
def readme_blocks() -> list[Block]:
    return blocks(README.read_text())


@pytest.fixture(scope="module")
def ran(readme_blocks: list[Block], tmp_path_factory: pytest.TempPathFactory):
    """The python blocks, run in one kernel; then the shell blocks, in the same folder."""
    where = tmp_path_factory.mktemp("readme")
    python = [b for b in readme_blocks if b.lang == "python"]
    cells = run_cells(*[b.code for b in python], cwd=where, timeout=300)
    return where, list(zip(python, cells, strict=True))


def test_every_block_is_python_bash_or_what_one_shows(readme_blocks: list[Block]) -> None:
    # yaml: a CI workflow to copy (the pytest plugin's), shown, not run.
    assert {b.lang for b in readme_blocks} <= {"python", "bash", "yaml"}, [
        (b.line, b.lang) for b in readme_blocks if b.lang not in ("python", "bash", "yaml")]
    assert sum(b.lang == "python" for b in readme_blocks) >= 10


def test_no_magic_line_carries_a_comment(readme_blocks: list[Block]) -> None:
    # IPython passes a trailing `# ...` to the magic as arguments.
    for block in readme_blocks:
        if block.lang != "python":
            continue
        for line in block.code.splitlines():
            if line.lstrip().startswith("%"):
                assert "#" not in line, f"README.md:{block.line}: {line!r}"


def test_python_blocks_run_in_order_and_show_what_the_readme_shows(ran) -> None:
    _, cells = ran
    for block, cell in cells:
        where = f"README.md:{block.line}:\n{block.code}"
        assert not errors(cell), f"{where}\nraised: {text(cell)}"
        if block.shows is not None:
            assert shows(block, text(cell)), f"{where}\nshows:\n{text(cell)}\nREADME says:\n{block.shows}"


def test_shell_blocks_run_here_unless_they_say_why_not(ran, readme_blocks: list[Block]) -> None:
    where, _ = ran
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVLAB_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # this venv's python
    env["PYTHONPATH"] = str(ROOT)
    shell = [b for b in readme_blocks if b.lang == "bash"]
    assert any(b.not_run is None for b in shell), "no shell block runs"
    for block in shell:
        if block.not_run is not None:
            continue
        output = ""
        for command in block.code.splitlines():
            if not command.strip() or command.startswith("#"):
                continue
            done = subprocess.run(["bash", "-c", command], cwd=where, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
            assert done.returncode == 0, f"README.md:{block.line}: {command}\n{done.stdout[-3000:]}"
            output += done.stdout
        if block.shows is not None:
            assert shows(block, output), f"README.md:{block.line}:\n{output}\nREADME says:\n{block.shows}"


def test_ci_runs_the_readmes_test_command(readme_blocks: list[Block]) -> None:
    (command,) = [line.split("#")[0].strip() for b in readme_blocks if b.lang == "bash"
                  for line in b.code.splitlines() if "scripts/test.sh" in line.split("#")[0]]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in [line.strip() for line in ci], f".ci/run no longer runs {command!r}"


def test_the_checker_tells_a_wrong_output_from_a_right_one() -> None:
    block = Block("python", "print(1)", 1, "a ... c\n")
    assert shows(block, "a b\nc\n") and not shows(block, "a b d\n")
