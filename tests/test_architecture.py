"""The shape of the code, as docs/ARCHITECTURE.md states it: the app and the engine stand on
floors and import only from their own floor's package or below (imports inside functions count),
no module imports another in a cycle, Qt stays in app/ui, no module imports or reads another's
underscore names, modules stay small, the row-group kernels share one driver, every package is
documented, and nothing cites a file outside the repo."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
MAX_LINES = 600

# The floors, lowest first (docs/ARCHITECTURE.md draws them). A module may import its own package
# and anything on a lower floor; packages sharing a floor do not import each other.
APP_FLOORS = [
    ("app", "app.engine", "app.docs", "app.store"),     # "app": the package itself (its version)
    ("app.runtime",),
    ("app.settings",),
    ("app.library",),
    ("app.qa",),
    ("app.session", "app.batch"),
    ("app.api", "app.bench"),
    ("app.ui",),
    ("app.cli",),
    ("app.__main__",),
]
ENGINE_FLOORS = [
    ("app.engine.header", "app.engine.cpu"),
    ("app.engine.ops",),
    ("app.engine.quant",),
    ("app.engine.kv",),
    ("app.engine.attention",),
    ("app.engine.model",),
    ("app.engine",),      # the backends: backend, ellm_backend, llamacpp_backend, generate, sampling
]


def _modules() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for every check."""
    return ast.parse(path.read_text())


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) of every import in ``path``, at any depth."""
    package = _name(path) if path.name == "__init__.py" else _name(path).rsplit(".", 1)[0]
    out = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            out.append((module, [a.name for a in node.names]))
    return out


def _graph() -> dict[str, set[str]]:
    """Every app module and the app modules it imports, at any depth of its code."""
    known = {_name(p) for p in _modules()}
    graph = {}
    for path in _modules():
        targets = set()
        for module, names in _imports(path):
            submodules = {f"{module}.{name}" for name in names} & known    # from package import module
            targets |= submodules
            if module in known and (not names or len(submodules) < len(names)):
                targets.add(module)
        graph[_name(path)] = targets - {_name(path)}
    return graph


def _package(module: str, floors: list[tuple[str, ...]]) -> str:
    """The longest floor package that holds ``module``."""
    holders = [p for floor in floors for p in floor if module == p or module.startswith(p + ".")]
    return max(holders, key=len)


def _floor(package: str, floors: list[tuple[str, ...]]) -> int:
    return next(i for i, floor in enumerate(floors) if package in floor)


def _floor_breaches(floors: list[tuple[str, ...]], within: str, graph: dict[str, set[str]] | None = None) -> list[str]:
    wrong = []
    for me, targets in (graph if graph is not None else _graph()).items():
        if not (me == within or me.startswith(within + ".")):
            continue
        mine = _package(me, floors)
        for target in targets:
            if not (target == within or target.startswith(within + ".")):
                continue
            theirs = _package(target, floors)
            if theirs != mine and _floor(theirs, floors) >= _floor(mine, floors):
                wrong.append(f"{me} imports {target}")
    return sorted(wrong)


def test_the_app_stands_on_its_floors():
    assert _floor_breaches(APP_FLOORS, "app") == []


def test_the_engine_stands_on_its_floors():
    assert _floor_breaches(ENGINE_FLOORS, "app.engine") == []


def test_every_engine_package_has_a_floor_and_the_floors_check_what_they_say():
    packages = {_name(p.parent / "__init__.py") for p in (APP / "engine").glob("*/__init__.py")}
    floored = {p for floor in ENGINE_FLOORS for p in floor} - {"app.engine"}
    assert packages == floored
    # made-up imports: upwards (kv -> model) and sideways (cpu <-> header) are caught, downwards not
    graph = {"app.engine.kv.blocked": {"app.engine.model.transformer", "app.engine.ops.f16"},
             "app.engine.cpu.threads": {"app.engine.header.support"},
             "app.engine.ellm_backend": {"app.engine.model.transformer", "app.engine.backend"}}
    assert _floor_breaches(ENGINE_FLOORS, "app.engine", graph) == [
        "app.engine.cpu.threads imports app.engine.header.support",
        "app.engine.kv.blocked imports app.engine.model.transformer"]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_another_in_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(_graph()) == []


def _private_names_defined(path: Path) -> set[str]:
    """Underscore names a module defines: functions, classes, attributes it assigns, globals."""
    names = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_reads_another_modules_private_attributes():
    """``obj._name`` where ``_name`` belongs to another app module (third-party privates, such as
    llama-cpp-python's, are outside this rule: the engine documents each where it uses it)."""
    defined = {path: _private_names_defined(path) for path in _modules()}
    everywhere = set().union(*defined.values())
    wrong = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr in everywhere and node.attr not in defined[path]):
                wrong.append(f"{_name(path)}:{node.lineno} reads {ast.unparse(node)}")
    assert wrong == []


def test_the_engine_imports_nothing_of_the_app_and_docs_and_store_stay_below_the_services():
    wrong = []
    for path in _modules():
        me = _name(path)
        for module, _ in _imports(path):
            if not module.startswith("app"):
                continue
            if me.startswith("app.engine") and not module.startswith("app.engine"):
                wrong.append(f"{me} imports {module}")
            for low in ("app.docs", "app.store"):
                if me.startswith(low) and not module.startswith(low):
                    wrong.append(f"{me} imports {module}")
    assert wrong == []


def test_no_front_end_sizes_a_backend():
    """The window, the command line, the API server and batches ask the session for a question's,
    a document's, a batch's or a chat's backend (app/session.py): none counts tokens to size one."""
    wrong = []
    for path in _modules():
        if _name(path).split(".")[1:2] not in (["ui"], ["cli"], ["api"], ["batch"]):
            continue
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("backend", "doc_tokens", "question_tokens", "chosen")):
                wrong.append(f"{_name(path)}:{node.lineno} calls .{node.func.attr}()")
    assert wrong == []


def test_qt_is_imported_only_in_app_ui():
    wrong = [f"{_name(p)} imports {m}" for p in _modules() if not _name(p).startswith("app.ui")
             for m, _ in _imports(p) if m.split(".")[0] in ("PySide6", "shiboken6")]
    assert wrong == []


def test_no_module_imports_another_modules_underscore_names():
    wrong = [f"{_name(p)}: from {m} import {n}" for p in _modules() for m, names in _imports(p)
             if m.startswith("app") for n in names if n.startswith("_") and not n.startswith("__")]
    assert wrong == []


def test_modules_are_small_and_few_are_loose():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert long == []
    loose_app = sorted(p.name for p in APP.glob("*.py"))
    loose_engine = sorted(p.name for p in (APP / "engine").glob("*.py"))
    assert len(loose_app) <= 6, loose_app
    assert len(loose_engine) <= 10, loose_engine


def test_every_row_group_kernel_runs_on_the_one_driver():
    """The modules whose kernels multiply row-group planes (quant/layout.py) leave the threads'
    split and the last group's padding to ``over_row_groups``: none has a prange or pads itself."""
    quant = APP / "engine" / "quant"
    users = sorted(p.name for p in quant.glob("*.py")
                   if any(m == "app.engine.quant.layout" and "over_row_groups" in names for m, names in _imports(p)))
    assert users == ["floats.py", "iquants.py", "kquants.py", "kquants_low.py", "legacy.py", "legacy_batch.py"]
    own = [f"{name}: {n.id}" for name in users for n in ast.walk(_tree(quant / name))
           if isinstance(n, ast.Name) and n.id in ("prange", "pad_group", "chunk_groups")]
    assert own == []


def test_the_architecture_document_names_every_package():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    packages = sorted(str(p.parent.relative_to(ROOT)) for p in APP.rglob("*/__init__.py")
                      if "__pycache__" not in p.parts)
    missing = [p for p in packages if f"`{p}`" not in text]
    assert len(packages) >= 15 and missing == []


def test_nothing_in_the_project_cites_a_file_outside_the_repository():
    cited = []
    for path in [*_modules(), *(ROOT / "tests").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        if path == Path(__file__):
            continue
        text = path.read_text()
        for needle in ("DESIGN.md", "STYLE.md", "../shared"):
            if needle in text:
                cited.append(f"{path.relative_to(ROOT)} cites {needle}")
    assert cited == []
