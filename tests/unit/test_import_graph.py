"""conveyor's import graph has no cycle at all, not only between sibling packages.

import-linter's ``acyclic_siblings`` contract (pyproject.toml) checks the
packages directly under ``conveyor``; a loop between a package's
``__init__`` and its own modules (the package re-exports a module that
imports the package back) is below what it sees, so this test walks every
module with grimp (import-linter's own graph) and finds strongly connected
components. Imports under ``TYPE_CHECKING`` do not run and are left out.
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every set of modules that import each other in a loop (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_conveyor_imports_itself_back_through_others() -> None:
    graph = grimp.build_graph("conveyor", exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_loop_through_a_package_init() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "other"):
        graph.add_module(module)
    graph.add_import(importer="pkg", imported="pkg.a")
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg")
    graph.add_import(importer="other", imported="pkg")
    assert _cycles(graph) == [["pkg", "pkg.a", "pkg.b"]]
