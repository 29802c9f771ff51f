"""Running a cell magic's body as IPython runs a cell: the last expression is the result,
and tracebacks show the cell's own lines, numbered as the user sees them."""

from __future__ import annotations

import ast
from types import CodeType
from typing import Any

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell


def compile_cell(
    shell: InteractiveShell, cell: str, kind: str = "cell", header: str = ""
) -> tuple[CodeType, CodeType | None]:
    """Compile a cell body (IPython syntax allowed).

    kind "cell": a last expression is compiled apart, to be the cell's value; "timed": all of
    it runs each time; "setup": code from the magic's own line. `header` (the `%%magic` line)
    is line 1 of the source tracebacks show, so line numbers match the notebook cell.
    """
    source = shell.transform_cell(cell)
    try:
        tree = shell.transform_ast(ast.parse(source))
    except SyntaxError as e:
        raise UsageError(f"SyntaxError in the {kind}: {e.msg} (line {e.lineno})") from None
    last = None
    if kind == "cell" and tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    offset = 0 if kind == "setup" else 1  # the cell's line 1 is the %%magic line
    for node in (tree, last):
        if node is not None:
            ast.increment_lineno(node, offset)
    shown = (header + "\n") * offset + source
    # IPython has counted the running cell already: it is execution_count - 1.
    number = max(1, shell.execution_count - 1)
    filename = shell.compile.cache(shown, number, raw_code=shown)
    code = shell.compile(tree, filename, "exec")
    value = shell.compile(last, filename, "eval") if last is not None else None
    return code, value


def run_body(shell: InteractiveShell, cell: str, header: str = "") -> Any:
    """Execute a cell body in the user namespace; return the value of a final expression.

    Errors propagate with the user's own frames, so a failing `%%device` cell fails like any
    cell does.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
    code, value = compile_cell(shell, cell, "cell", header)
    exec(code, shell.user_global_ns, shell.user_ns)
    if value is not None:
        return eval(value, shell.user_global_ns, shell.user_ns)
    return None
