"""The house's figures of a conveyor source tree, read from its files (nothing imported or run).

    python -m bench.house [ROOT]            # ROOT: a checkout (default: this one)
    git archive 3a03d26 | tar -x -C /tmp/before && python -m bench.house /tmp/before

It prints what docs/house.md tabulates: settings fields per settings class,
exception classes per file, migrations per directory, import-linter
contracts, modules and lines per package, private members one broker
object reaches on another, and the fields each job/worker/attempt row type
declares, and the Redis broker's data access outside ``redis/jobs.py``
(the methods that send Redis commands or script calls themselves, with
their lines). Counting from the source lets the same script read a commit
from before a refactor, whose modules may no longer import.
"""

from __future__ import annotations

import ast
import builtins
import collections
import sys
import tomllib
from pathlib import Path

#: Exception bases from outside conveyor that its classes derive from.
FOREIGN_EXCEPTIONS = {"ConnectionClosed", "DramatiqError", "HTTPException", "RedisError", "ValidationError"}
#: The row types of issue 19: one job, one worker, one attempt, each once in the store, the read layer, the API.
ROW_TYPES = (
    "JobRecord",
    "JobView",
    "Job",
    "WorkerInfo",
    "WorkerView",
    "Worker",
    "AttemptInfo",
    "AttemptView",
    "Attempt",
)
BUILTIN_EXCEPTIONS = {
    n
    for n in dir(builtins)
    if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
}


def settings_fields(trees: dict[str, ast.Module]) -> dict[str, int]:
    out = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Settings") and node.name != "BaseSettings":
                count = sum(
                    isinstance(b, ast.AnnAssign)
                    and isinstance(b.target, ast.Name)
                    and not b.target.id.startswith("_")
                    and "ClassVar" not in ast.unparse(b.annotation)
                    for b in node.body
                )
                if count:
                    out[f"{node.name} ({path})"] = count
    return out


def exception_classes(trees: dict[str, ast.Module]) -> collections.Counter[str]:
    bases: dict[str, list[str]] = {}
    where: list[tuple[str, str, list[str]]] = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = [ast.unparse(b).split(".")[-1] for b in node.bases]
                bases.setdefault(node.name, []).extend(names)
                where.append((path, node.name, names))

    def is_exception(name: str, seen: frozenset[str]) -> bool:
        if name in BUILTIN_EXCEPTIONS or name in FOREIGN_EXCEPTIONS:
            return True
        return name not in seen and any(is_exception(b, seen | {name}) for b in bases.get(name, ()))

    return collections.Counter(p for p, name, names in where if any(is_exception(b, frozenset({name})) for b in names))


def foreign_privates(trees: dict[str, ast.Module], under: str) -> list[str]:
    """``x._name`` in modules under ``under`` where x is not self, cls or super() (the unit test's rule)."""
    found = []
    for path, tree in trees.items():
        if not path.startswith(under):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                found.append(f"{path}: {ast.unparse(node)}")
    return found


#: Calls that are Redis commands whatever object they are made on (tests/unit/test_redis_broker_shape.py's list).
REDIS_CALLS = {"pipeline", "register_script", "pubsub", "execute_command", "eval", "evalsha", "script_load"}
#: The modules of the Redis broker that may send its commands: jobs.py and the send plumbing it uses.
REDIS_SENDERS = {"jobs.py", "sending.py", "cluster.py"}


def _sends_redis(function: ast.AST) -> bool:
    """A command on a client (``….client.cmd(…)``), a pipeline, a script or pub/sub, or a script call
    (the old broker's ``self._call`` / ``self._jobs``, the new one's ``….jobs.call``)."""
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = node.func.value, node.func.attr
            if (isinstance(owner, ast.Name) and owner.id == "client") or (
                isinstance(owner, ast.Attribute) and owner.attr == "client"
            ):
                return True
            if name in REDIS_CALLS or name in ("_call", "_jobs"):
                return True
            if isinstance(owner, ast.Attribute) and owner.attr == "jobs" and name in ("call", "script"):
                return True
    return False


def redis_data_access(trees: dict[str, ast.Module], root: Path) -> dict[str, tuple[int, int, int]]:
    """Per module of brokers/redis outside jobs.py and its plumbing: (lines, functions that send Redis
    commands themselves, their lines)."""
    out = {}
    for path, tree in trees.items():
        if not path.startswith("conveyor/brokers/redis/") or path.rsplit("/", 1)[1] in REDIS_SENDERS:
            continue
        functions = [
            n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _sends_redis(n)
        ]
        # A nested function is counted with the one that holds it.
        outer = [f for f in functions if not any(g is not f and f in ast.walk(g) for g in functions)]
        lines = sum((f.end_lineno or f.lineno) - f.lineno + 1 for f in outer)
        out[path] = (len((root / path).read_text().splitlines()), len(outer), lines)
    return out


def row_types(trees: dict[str, ast.Module]) -> list[str]:
    out = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in ROW_TYPES:
                declared = sum(isinstance(b, ast.AnnAssign) for b in node.body)
                derived = ", ".join(ast.unparse(b) for b in node.bases) or "-"
                out.append(f"{node.name} ({path}): {declared} fields declared, bases {derived}")
    return sorted(out)


def main(root: Path) -> None:
    package = root / "conveyor"
    files = sorted(package.rglob("*.py"))
    trees = {p.relative_to(root).as_posix(): ast.parse(p.read_text(), str(p)) for p in files}
    print("settings fields:", settings_fields(trees))
    errors = exception_classes(trees)
    print("exception classes:", sum(errors.values()), dict(errors.most_common()))
    migrations = collections.Counter(
        p.parent.relative_to(root).as_posix() for p in package.rglob("*.sql") if "migrations" in p.parts
    )
    print("migrations:", dict(migrations))
    config = tomllib.loads((root / "pyproject.toml").read_text())
    print("import-linter contracts:", len(config.get("tool", {}).get("importlinter", {}).get("contracts", [])))
    modules: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    for p in files:
        parts = p.relative_to(package).parts
        key = parts[0] if len(parts) > 1 else "(top-level modules)"
        modules[key] += 1
        lines[key] += len(p.read_text().splitlines())
    for key in sorted(modules):
        print(f"  {key}: {modules[key]} modules, {lines[key]} lines")
    print(f"  total: {sum(modules.values())} modules, {sum(lines.values())} lines")
    privates = foreign_privates(trees, "conveyor/brokers")
    print("another object's private members used in conveyor/brokers:", len(privates))
    for line in privates:
        print("  ", line)
    print("Redis broker modules outside jobs.py: lines, functions sending Redis commands themselves, their lines")
    for path, (total, count, lines_sending) in sorted(redis_data_access(trees, root).items()):
        print(f"   {path}: {total} lines, {count} functions, {lines_sending} lines")
    for line in row_types(trees):
        print("row type", line)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
