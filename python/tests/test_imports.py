"""The library's modules import one another in one direction only."""

from __future__ import annotations

import ast
import pathlib
import unittest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "intentd"


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(tree: ast.Module) -> tuple[set[str], list[int]]:
    """The library modules a module imports when it runs (type-only imports
    under TYPE_CHECKING aside), and the lines of imports of library modules
    made inside functions, which only hide a circle."""
    runtime: set[str] = set()
    hidden: list[int] = []

    def visit(nodes: list[ast.stmt], in_function: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                name = (node.module or "").split(".")[0]
                if in_function:
                    hidden.append(node.lineno)
                else:
                    runtime.add(name)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                continue
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(node.body, True)
            elif isinstance(node, ast.ClassDef):
                visit(node.body, in_function)
            elif hasattr(node, "body"):
                visit(getattr(node, "body"), in_function)

    visit(tree.body, False)
    return runtime, hidden


class ImportsTest(unittest.TestCase):
    def test_no_circle_and_no_import_in_a_function(self) -> None:
        graph: dict[str, set[str]] = {}
        for path in sorted(PACKAGE.glob("*.py")):
            runtime, hidden = _imports(ast.parse(path.read_text(), str(path)))
            self.assertEqual(hidden, [], f"{path.name} imports library modules inside functions at lines {hidden}")
            graph[path.stem] = runtime - {"__init__"}

        # Depth-first search for a circle among the modules (the package's
        # __init__ imports every module and nothing imports it back).
        done: set[str] = set()

        def walk(module: str, path: list[str]) -> None:
            if module in path:
                self.fail("import circle: " + " -> ".join(path[path.index(module):] + [module]))
            if module in done:
                return
            for dep in sorted(graph.get(module, ())):
                walk(dep, path + [module])
            done.add(module)

        for module in sorted(graph):
            walk(module, [])


if __name__ == "__main__":
    unittest.main()
