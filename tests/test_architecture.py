"""The shape of the code, as docs/ARCHITECTURE.md states it: imports point downwards, Qt stays
in app/ui, the engine imports nothing of the app, no module imports another's underscore names,
modules stay small, every package is documented, and nothing cites a file outside the repo."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in APP.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) of every import in ``path``, at any depth."""
    package = _name(path) if path.name == "__init__.py" else _name(path).rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
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
