"""Running a cell magic's body as IPython runs a cell: the last expression is the result."""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.interactiveshell import InteractiveShell


def run_body(shell: InteractiveShell, cell: str) -> Any:
    """Execute `cell` in the user namespace; return the value of a final expression.

    Errors propagate with the user's own frames (and the cell's source lines), so a failing
    `%%device` cell fails like any cell does.
    """
    __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
    source = shell.transform_cell(cell)
    tree = shell.transform_ast(shell.compile.ast_parse(source))
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    filename = shell.compile.cache(source, number=shell.execution_count)
    ns = shell.user_ns
    exec(shell.compile(tree, filename, "exec"), ns)
    if last is not None:
        return eval(shell.compile(last, filename, "eval"), ns)
    return None
