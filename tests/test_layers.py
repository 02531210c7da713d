"""The package's import structure runs downward: each module imports only layers below its own.

Layers, from the bottom: errors and categorical draws; plain values and pure functions (verification,
statistics, acceptance); configuration and text; models, sampling and a
request's output; drafters; costs; the controller; a running request; the engine; the engine's
asyncio wrapper and the measurement toolkit; the tools built on the engine (bench, distill, server,
each on its own); the commands; the CLI. Modules of one package may import each other. An import
running back up (say the head drafter reaching into the training code) fails here.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "quickdraft"
LAYERS = [
    ("quickdraft",),  # the package's __init__: lazy re-exports only
    ("quickdraft.errors", "quickdraft.categorical"),
    ("quickdraft.verify", "quickdraft.stats", "quickdraft.acceptance"),
    ("quickdraft.config", "quickdraft.text"),
    ("quickdraft.models", "quickdraft.sampling", "quickdraft.output"),
    ("quickdraft.drafters",),
    ("quickdraft.costs",),
    ("quickdraft.controller",),
    ("quickdraft.running",),
    ("quickdraft.engine",),
    ("quickdraft.async_engine", "quickdraft.measure"),
    ("quickdraft.bench", "quickdraft.distill", "quickdraft.server"),
    ("quickdraft.commands",),
    ("quickdraft.cli",),
    ("quickdraft.__main__",),
]


def unit(module: str) -> str:
    """The layer entry a module belongs to (its top-level package or module under quickdraft)."""
    return ".".join(module.split(".")[:2])


RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def quickdraft_imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """Every quickdraft module `path` imports, at the top or inside a function: `import quickdraft.x`,
    `from quickdraft.x import y`, `from quickdraft import x` (as quickdraft.x) and relative imports."""
    here = module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package the module is in
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)  # a name or a submodule: unit() cuts it
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("quickdraft.")}


def upward_imports(package: Path) -> list[str]:
    """ "importer -> imported" for every import in `package` that does not run to a lower layer."""
    upward = []
    for path in sorted(package.rglob("*.py")):
        importer = unit(module_name(path, package))
        for imported in quickdraft_imports(path, package):
            if unit(imported) != importer and RANK[importer] <= RANK[unit(imported)]:
                upward.append(f"{module_name(path, package)} -> {imported}")
    return upward


def test_every_module_has_a_layer():
    units = {unit(module_name(path)) for path in PACKAGE.rglob("*.py")} - {"quickdraft"}
    assert units <= set(RANK), f"modules with no layer: {sorted(units - set(RANK))}"


def test_every_import_runs_downward():
    upward = upward_imports(PACKAGE)
    assert not upward, "imports that do not run downward:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import_and_one_between_tools(tmp_path):
    """The rule itself, on a copy of the package where the drafters' base imports the training code and
    the server imports the benchmarks."""
    package = tmp_path / "quickdraft"
    for relative in ("drafters/base.py", "server/app.py", "engine.py"):
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text((PACKAGE / relative).read_text())
    with (package / "drafters" / "base.py").open("a") as file:
        file.write("\nfrom quickdraft.distill.train import Trainer\n")
    with (package / "server" / "app.py").open("a") as file:
        file.write("\nimport quickdraft.bench.runner\nfrom quickdraft import engine\nfrom ..bench import report\n")
    assert set(upward_imports(package)) >= {
        "quickdraft.drafters.base -> quickdraft.distill.train.Trainer",
        "quickdraft.server.app -> quickdraft.bench.runner",
        "quickdraft.server.app -> quickdraft.bench.report",
    }
    assert "quickdraft.server.app -> quickdraft.engine" not in upward_imports(package)  # downward: allowed
