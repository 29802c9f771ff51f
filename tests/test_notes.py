"""Named notes: a long explanation is written once, as `# Note [Title]` on a comment line of its
own in the module that owns it, and cited elsewhere as `See Note [Title]` (as PyTorch writes
them). Every cited note must exist, exactly once."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFINITION = re.compile(r"^\s*# Note \[([^\]]+)\]\s*$", re.M)
CITATION = re.compile(r"See Note \[([^\]]+)\]")


def _sources() -> list[Path]:
    return sorted([*ROOT.glob("devlab/**/*.py"), *ROOT.glob("docs/*.md")])


def _flat(text: str) -> str:
    """The text with its line breaks (and comment marks) as spaces: a citation may wrap."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def test_every_cited_note_is_written_exactly_once():
    written: Counter[str] = Counter()
    cited: dict[str, list[str]] = {}
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".py":
            written.update(DEFINITION.findall(text))
        for title in CITATION.findall(_flat(text)):
            cited.setdefault(title, []).append(str(path.relative_to(ROOT)))
    assert cited, "no note is cited"
    missing = {t: where for t, where in cited.items() if written[t] == 0}
    assert not missing, f"cited notes written nowhere: {missing}"
    twice = [t for t, n in written.items() if n > 1]
    assert not twice, f"notes written more than once: {twice}"
    uncited = [t for t in written if t not in cited]
    assert not uncited, f"notes no other place cites: {uncited}"


def test_the_notes_of_issue_30_are_written():
    written = {t for p in _sources() if p.suffix == ".py"
               for t in DEFINITION.findall(p.read_text(encoding="utf-8"))}
    assert {"Why ops run watched", "Why a rank waits at exit",
            "Why queued work's storages are uncounted",
            "Why empty memory reads as zeros"} <= written
