"""A notebook cell as a script for torchrun (`export_script`).

What `%%distributed --export` writes: the cell after import lines for the notebook's modules
and objects it uses.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

from devlab.core.ranks.handoff import _names_used


@dataclasses.dataclass
class Export:
    """What `export_script` wrote: the file, the imports it added, names it could not."""

    path: Path
    imports: list[str]
    missing: list[str]
    nprocs: int

    def text(self) -> str:
        lines = [f"Wrote {self.path}: torchrun --standalone --nproc-per-node {self.nprocs} "
                 f"{self.path.name}",
                 f"  on simulated GPUs: DEVLAB_SIMULATE_GPUS={self.nprocs} torchrun --standalone "
                 f"--nproc-per-node {self.nprocs} {self.path.name}"]
        if self.missing:
            lines.append("  defined in the notebook, not in the script (add them to it): "
                         + ", ".join(self.missing))
        return "\n".join(lines)

    __repr__ = text


def export_script(source: str, path: str | Path, namespace: dict[str, Any],
                  nprocs: int = 2) -> Export:
    """Write a cell's Python source as a script for `torchrun`: the cell, after import lines
    for the modules and importable objects of `namespace` it uses. Names defined only in the
    notebook are reported (`Export.missing`), not guessed."""
    path = Path(path)
    if path.suffix != ".py":
        raise ValueError(f"the script's name should end in .py, got {str(path)!r}")
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"cannot write the script to {str(path)!r}: the folder {str(folder)!r} "
                         "does not exist")
    if path.is_dir():
        raise ValueError(f"cannot write the script to {str(path)!r}: it is a folder")
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"the cell is not plain Python (line {e.lineno}: {e.msg}); a script "
                         "cannot hold IPython syntax such as %magics or !commands") from None
    code = compile(tree, str(path), "exec")
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, (ast.Store, ast.Del))}
    assigned |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assigned |= {n.name for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    imports, missing = [], []
    for name in sorted(_names_used(code) - assigned - set(dir(builtins))):
        if name not in namespace:
            continue
        line = _import_line(name, namespace[name])
        if line is None:
            missing.append(name)
        else:
            imports.append(line)
    header = ["# Written by devlab's %%distributed --export from a notebook cell.",
              f"# Run: torchrun --standalone --nproc-per-node {nprocs} {path.name}"]
    text = "\n".join(header + [""] + imports + ([""] if imports else []) + [source.rstrip(), ""])
    try:
        path.write_text(text)
    except OSError as e:
        raise ValueError(f"cannot write the script to {str(path)!r}: "
                         f"{e.strerror or type(e).__name__}") from None
    return Export(path, imports, missing, nprocs)


def _import_line(name: str, obj: Any) -> str | None:
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
        if module == name:
            return f"import {module}"
        parent, _, leaf = module.rpartition(".")
        return f"from {parent} import {leaf}" if parent and leaf == name else \
            f"import {module} as {name}"
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "." in qualname \
            or "<" in qualname or module not in sys.modules \
            or getattr(sys.modules[module], qualname, None) is not obj:
        return None
    return f"from {module} import {qualname}" + (f" as {name}" if qualname != name else "")
