"""The architecture's contract, read from the source (no import runs):

- cli -> agent -> core, never backwards;
- core/worker (the training script's API) imports nothing of rtrain but core, and the
  rest of core does not depend on it; agent/ and cli/ do not either: what they share
  with workers is core/contract's;
- the pure part of core (all of it but core/worker) imports nothing that does I/O,
  starts threads or processes, or sleeps, and calls no open(), print() or input();
- exit codes are named (core/errors.ExitCode), never written as numbers where an error
  is raised or a process exits.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "rtrain"  # the package: cli, agent, core
LAYERS = {"cli": 2, "agent": 1, "core": 0}  # a layer imports only lower or equal ones
IO_MODULES = {
    "asyncio", "concurrent", "ctypes", "fcntl", "glob", "http", "io", "mmap",
    "multiprocessing", "os", "pathlib", "psutil", "pynvml", "select", "selectors",
    "shutil", "socket", "subprocess", "tempfile", "threading", "time", "urllib",
}  # fmt: skip
IO_CALLS = {"open", "print", "input", "exec", "eval", "breakpoint"}
ERRORS = {"RtrainError", "UsageError", "RendezvousError", "StoreUnavailable", "LayoutError"}


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    """(dotted name under rtrain, path, tree) of every module of the three layers."""
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path, ast.parse(path.read_text(), str(path))


def imports(name: str, path: Path, tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Every module imported (at any depth), relative ones resolved like Python does."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.module or "", node.lineno
                continue
            full = ["rtrain", *package]
            base = full[: len(full) - node.level + 1]
            assert base, f"{path}:{node.lineno}: relative import beyond rtrain"
            yield ".".join([*base, *filter(None, (node.module or "").split("."))]), node.lineno


ALL = list(modules())


def rtrain_layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "rtrain" and len(parts) > 1 and parts[1] in LAYERS:
        return parts[1]
    return None


def test_imports_follow_the_layers() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for name, path, tree in ALL
        for module, line in imports(name, path, tree)
        if (target := rtrain_layer(module)) is not None
        and LAYERS[target] > LAYERS[name.split(".")[0]]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_agent_and_the_cli_meet_workers_only_through_the_contract() -> None:
    """What an agent and its workers share (files, variables, records) is core/contract's;
    agent/ and cli/ never import the worker API's internals (core/worker)."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for name, path, tree in ALL
        if not name.startswith("core")
        for module, line in imports(name, path, tree)
        if module.startswith("rtrain.core.worker")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_worker_package_and_the_pure_core_keep_to_themselves() -> None:
    wrong: list[str] = []
    for name, path, tree in ALL:
        if name.startswith("core"):
            wrong += _core_findings(name, path, tree)
    assert not wrong, "\n".join(wrong)


def _core_findings(name: str, path: Path, tree: ast.Module) -> list[str]:
    in_worker = name.startswith("core.worker")
    wrong = []
    for module, line in imports(name, path, tree):
        where = f"{path.relative_to(ROOT)}:{line} imports {module}"
        if module == "rtrain" or (module.startswith("rtrain.") and rtrain_layer(module) != "core"):
            wrong.append(where)
        # core/__init__ re-exports the worker API as rtrain.core, on purpose.
        if not in_worker and name != "core" and module.startswith("rtrain.core.worker"):
            wrong.append(f"{where} (the pure core must not depend on the worker API)")
        if not in_worker and module.split(".")[0] in IO_MODULES:
            wrong.append(f"{where} (I/O, threads or sleeping: not in the pure core)")
    if not in_worker:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in IO_CALLS
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} calls {node.func.id}()")
    return wrong


def _literal_code(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value != 0


def test_exit_codes_are_named() -> None:
    wrong = []
    for path, node in ((p, n) for _, p, tree in ALL for n in ast.walk(tree)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        literal = [a for a in node.args[1:] if _literal_code(a)] if called in ERRORS else []
        literal += [k.value for k in node.keywords if k.arg == "exit_code"]
        if called in ("exit", "Exit", "SystemExit", "_exit"):
            literal += node.args[:1]
        if any(_literal_code(a) for a in literal):
            wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {called}() with a bare code")
    assert not wrong, "\n".join(wrong)


def test_the_worker_api_is_the_surface_of_rtrain_core_and_rtrain() -> None:
    import rtrain
    import rtrain.core
    import rtrain.core.worker

    assert rtrain.core.__all__ == rtrain.core.worker.__all__
    for name in rtrain.core.worker.__all__:
        assert getattr(rtrain, name) is getattr(rtrain.core, name)
        assert getattr(rtrain.core, name) is getattr(rtrain.core.worker, name)
