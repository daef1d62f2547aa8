"""The house's structure, checked: no import circles, inference never imports training, one
registry per concept (methods, drafter kinds, options) that every surface reads."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "quickdraft"
INFERENCE = (
    "runtime",
    "weights",
    "costs",
    "models",
    "drafters",
    "verifiers",
    "decoding",
    "engine",
    "options",
    "prompts",
    "sampling",
    "config",
)


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the quickdraft modules it imports (at any depth: lazy imports and TYPE_CHECKING
    blocks count; a circle through type hints is still a circle in the design)."""
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quickdraft"):
                for alias in node.names:  # "from pkg import submodule" imports the submodule
                    sub = f"{node.module}.{alias.name}"
                    deps.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("quickdraft"))
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_circles():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_type_checking_imports_count(tmp_path, monkeypatch):  # negative control: a circle through type hints
    pkg = tmp_path / "quickdraft"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from quickdraft.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from quickdraft.a import A\nB = 1\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    assert find_cycle(import_graph()) == ["quickdraft.a", "quickdraft.b", "quickdraft.a"]


# The house's floors, top-down (a module imports only from its own floor or below): cli ->
# server/bench/training -> engine -> options -> decoding -> drafters -> costs -> verifiers/runtime ->
# weights -> config -> the ground floor (host plumbing, errors, types).
FLOORS = {
    "cli": 0,
    "server": 1, "bench": 1, "training": 1, "export": 1, "api": 1,
    "engine": 2,
    "settings": 3,
    "decoding": 4,
    "drafters": 5, "models": 5,
    "costs": 6,
    "verifiers": 7, "runtime": 7, "sampling": 7,
    "weights": 8,
    "config": 9, "prompts": 9,
    "host": 10, "errors": 10, "types": 10, "spec_options": 10,
}  # fmt: skip
KNOWN_UP: set[tuple[str, str]] = set()  # none left (issue #48: the quantized linears moved to runtime/)


def arrows_up(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) pairs where a module imports from a floor above its own."""

    def floor(module: str) -> int:
        room = module.split(".")[1]
        assert room in FLOORS, f"{module}: a room with no floor (add it to FLOORS)"
        return FLOORS[room]

    return {(a, b) for a, deps in graph.items() if a != "quickdraft" for b in deps if floor(b) < floor(a)}


def test_nothing_imports_from_a_floor_above_it():
    assert arrows_up(import_graph()) - KNOWN_UP == set()


def test_an_arrow_up_is_found():  # negative control
    graph = {k: set(v) for k, v in import_graph().items()}
    graph["quickdraft.runtime.kernels.linear"].add("quickdraft.costs.cost_curve")
    assert ("quickdraft.runtime.kernels.linear", "quickdraft.costs.cost_curve") in arrows_up(graph)


def test_the_cycle_finder_finds_a_planted_cycle():  # negative control
    graph = import_graph()
    graph["quickdraft.weights.loading"] = graph["quickdraft.weights.loading"] | {"quickdraft.engine"}
    assert find_cycle(graph) is not None


@pytest.mark.parametrize("area", INFERENCE)
def test_inference_never_imports_training(area):
    graph = import_graph()
    for module, deps in graph.items():
        if module.removeprefix("quickdraft.").split(".")[0] == area:
            training = sorted(d for d in deps if d.startswith("quickdraft.training"))
            assert not training, f"{module} imports {training}"


def test_every_surface_takes_its_names_from_the_registries():
    from quickdraft.bench.methods import KEYS
    from quickdraft.decoding.registry import METHODS
    from quickdraft.drafters import BUILDERS, KINDS
    from quickdraft.settings.options import OPTIONS

    assert set(BUILDERS) == set(KINDS)
    assert set(METHODS) <= set(KEYS) and OPTIONS["method"].choices == tuple(METHODS)
    for method in METHODS.values():
        assert set(method.options) <= set(OPTIONS)
    text = "\n".join(p.read_text() for p in SRC.rglob("*.py") if p.name != "settings/options.py")
    assert "DraftConfig(" not in text.replace("class DraftConfig(", ""), (
        "DraftConfig is built outside settings/options.py"
    )
    assert "method ==" not in text, "a surface switches on a method name"


def test_capabilities_are_declared_not_probed():
    """Drafters, verifiers and cache owners declare what they can do (base classes with defaults):
    no hasattr on the project's own objects (the two left probe transformers' tokenizer outputs and
    configs)."""
    allowed = {"training/data.py", "training/student.py"}
    probing = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if "hasattr(" in p.read_text() and str(p.relative_to(SRC)) not in allowed
    )
    assert not probing, probing


RUNTIME_NAMES = re.compile(r"""(==|!=)\s*["'](hf|native)["']|isinstance\([^)]*\b(NativeCachedModel|CachedModel)\b""")


def runtime_switches(root: Path) -> list[str]:
    """Files that compare a runtime's name or test a concrete runtime class (runtime/choose.py may)."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if str(p.relative_to(root)) != "runtime/choose.py" and RUNTIME_NAMES.search(p.read_text())
    )


_KIND_TEST = re.compile(r"\.kind\s*(?:==|!=)\s*\"(\w+)\"|\.kind\s+(?:not\s+)?in\s*\(([^)]*)\)")


def kind_switches(root: Path, own: dict[str, str]) -> list[str]:
    """`file: kind` for each drafter kind name compared outside the kind's own file (`own`: kind ->
    its file under root), and each builder reading a stage's text (`spec.arg`) instead of its value."""
    found = []
    for p in sorted(root.rglob("*.py")):
        rel, text = str(p.relative_to(root)), p.read_text()
        for m in _KIND_TEST.finditer(text):
            names = [m.group(1)] if m.group(1) else re.findall(r"\"(\w+)\"", m.group(2))
            found += [f"{rel}: {n}" for n in names if n in own and own[n] != rel]
        found += [f"{rel}: spec.arg"] * ("spec.arg" in text)
    return found


def test_a_drafter_kind_is_named_in_its_own_file_only():
    """No kind name outside its own file and the registry; builders receive values, not strings."""
    from quickdraft.drafters.kinds import KINDS

    own = {name: str(Path(sys.modules[k.build.__module__].__file__).relative_to(SRC)) for name, k in KINDS.items()}
    assert kind_switches(SRC, own) == []


def test_a_kind_switch_is_found(tmp_path):  # negative control
    (tmp_path / "cli.py").write_text('if stage.kind == "truncated":\n    x = s.kind in ("model", "csd")\n')
    (tmp_path / "m.py").write_text('if stage.kind == "truncated":\n    n = int(spec.arg)\n')
    own = {"truncated": "m.py", "model": "m.py", "csd": "c.py"}
    assert kind_switches(tmp_path, own) == ["cli.py: truncated", "cli.py: model", "cli.py: csd", "m.py: spec.arg"]


def test_runtimes_are_chosen_in_one_place():
    """A third backend edits runtime/choose.py only: nowhere else compares a runtime's name or
    checks a concrete cache owner's class (capabilities are declared on the Target protocol)."""
    assert runtime_switches(SRC) == []


def test_a_runtime_switch_is_found(tmp_path):  # negative control
    (tmp_path / "drafters").mkdir()
    (tmp_path / "drafters" / "x.py").write_text('if runtime == "hf":\n    pass\n')
    (tmp_path / "y.py").write_text("ok = isinstance(t, NativeCachedModel)\n")
    assert runtime_switches(tmp_path) == ["drafters/x.py", "y.py"]


def drafting_methods(root: Path) -> dict[str, list[str]]:
    """{file: the argument names of every `propose*` method defined there}."""
    found: dict[str, list[str]] = {}
    for p in root.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("propose"):
                found.setdefault(str(p.relative_to(root)), []).append(
                    node.name + "(" + ",".join(a.arg for a in node.args.args) + ")"
                )
    return found


def test_one_drafting_method():
    """A chain is a tree one node wide: every drafter has one `propose(context, request, sampling,
    generator)` returning a TokenTree; no `propose_tree` beside it, no chain-only signature."""
    one = "propose(self,context,request,sampling,generator)"
    other = {f: m for f, m in drafting_methods(SRC).items() if set(m) != {one}}
    assert not other, other
    assert len(drafting_methods(SRC)) >= 10  # every drafter file was scanned


def test_one_drafting_method_finds_a_second_protocol(tmp_path):  # negative control
    (tmp_path / "old.py").write_text(
        "class D:\n    def propose(self, context, request, sampling, generator): ...\n"
        "    def propose_tree(self, context, shape, sampling, generator): ...\n"
    )
    assert drafting_methods(tmp_path) == {
        "old.py": [
            "propose(self,context,request,sampling,generator)",
            "propose_tree(self,context,shape,sampling,generator)",
        ]
    }


# a path a docstring, comment or doc page cites: "runtime/kernels/linear.py", "src/quickdraft/runtime/kernels",
# "quickdraft.runtime.quant.w8a8", "scripts/fim_check.py", "docs/bench/serve-pair/", ... (issue #68 item 6)
_re = __import__("re")
ROOMS = "bench|costs|decoding|drafters|models|runtime|server|training|verifiers|weights|formats|kernels|caches|forward"
_CITED = _re.compile(rf"(?<![\w/.\-])((?:{ROOMS})/[\w/]*\w(?:\.(?:py|cpp|h))?)(?![\w(\-])")
_TREE = _re.compile(r"(?<![\w/.\-])((?:src/quickdraft|scripts|tests|docs|\.ci)/[\w/.\-]*[\w/])")
_DOTTED = _re.compile(r"(?<![\w.])(quickdraft(?:\.\w+)+)")
ROOT = SRC.parents[1]


def cited_paths(text: str) -> set[str]:
    """Package paths (relative to src/quickdraft) a text cites, with or without an extension."""
    return set(_CITED.findall(text))


def _package_path_exists(cited: str) -> bool:
    if set(cited.split("/")) <= set(ROOMS.split("|")):  # the layering's notation: "server/bench/training"
        return True
    base = SRC / cited
    if base.exists():
        return True
    # a room path cited from inside its room ("kernels/w8a8.h" in runtime/), or a module named bare
    return any(
        p.exists() for p in (base.with_suffix(".py"), *(SRC / r / cited for r in ("runtime", "server", "bench")))
    )


def _dotted_exists(name: str) -> bool:
    """quickdraft.a.b[.attr]: a module (file or package), or an attribute a module's source defines."""
    parts = name.split(".")[1:]
    if parts[-1] in FILE_SUFFIXES:  # a file's name ("quickdraft.json"), not a module
        return True
    for n in range(len(parts), -1, -1):
        mod = SRC.joinpath(*parts[:n])
        source = mod.with_suffix(".py") if mod.with_suffix(".py").exists() else mod / "__init__.py"
        if not source.exists() and mod.is_dir() and n == len(parts):  # a namespace package (runtime/caches)
            return True
        if source.exists():
            rest = parts[n:]
            text = source.read_text()
            return (
                not rest
                or _re.search(
                    rf"(def|class)\s+{rest[0]}\b|^{rest[0]}\b|\b{rest[0]}\s*[:=]|import.*\b{rest[0]}\b", text, _re.M
                )
                is not None
            )
    return False


FILE_SUFFIXES = {"json", "packed", "safetensors", "gguf", "txt", "md", "jsonl"}


def _placeholder(path: str) -> bool:
    """A path written as a pattern ("docs/bench/NAME/report.md", "costs/packing-*.json")."""
    return "*" in path or any(part.isupper() and len(part) > 1 for part in _re.split(r"[/.\-]", path))


def missing_citations(root, files, trees: bool = True) -> set[str]:
    """`file: cited` for every cited path or module in `files` (under `root`) that does not exist (with
    `trees`, repository paths such as scripts/x.py too: the docs' and sources' notation)."""
    missing = set()
    for path in files:
        text = path.read_text()
        rel = path.relative_to(root)
        missing |= {f"{rel}: {c}" for c in cited_paths(text) if not _package_path_exists(c)}
        if trees:
            missing |= {f"{rel}: {c}" for c in _TREE.findall(text) if not (root / c).exists() and not _placeholder(c)}
        missing |= {f"{rel}: {c}" for c in _DOTTED.findall(text) if not _dotted_exists(c)}
    return missing


def cited_files(root) -> list:
    src = [p for ext in ("*.py", "*.h", "*.cpp") for p in (root / "src" / "quickdraft").rglob(ext)]
    return [*src, root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]


def cited_by_tests(root) -> list:
    """Tests and scripts: they cite the modules they exercise (this file aside: its controls cite moved paths)."""
    tests = [p for p in sorted((root / "tests").glob("test_*.py")) if p.name != "test_structure.py"]
    return [*tests, *sorted((root / "scripts").glob("*.py"))]


def test_every_cited_path_exists():
    missing = missing_citations(ROOT, cited_files(ROOT)) | missing_citations(ROOT, cited_by_tests(ROOT), trees=False)
    assert not missing, sorted(missing)


def test_a_cited_path_that_moved_is_found(tmp_path):  # negative control
    text = (
        "See models/linear.py and runtime/kernels/linear.py "
        "(src/quickdraft/runtime/caches/kv_cache.py is not cited twice)."
    )
    assert cited_paths(text) == {"models/linear.py", "runtime/kernels/linear.py"}
    assert not (SRC / "models/linear.py").exists()
    page = tmp_path / "page.md"
    page.write_text(
        "runtime/quant/formats, runtime/gone, quickdraft.runtime.quant.w8a8.W8A8Linear, quickdraft.runtime.nope, "
        "quickdraft.runtime.quant.w8a8.Nope, scripts/nope.py, quickdraft.generate, docs/bench/NAME/x.md"
    )
    assert missing_citations(tmp_path, [page]) == {
        "page.md: runtime/gone",
        "page.md: quickdraft.runtime.nope",
        "page.md: quickdraft.runtime.quant.w8a8.Nope",
        "page.md: scripts/nope.py",
    }


# every file under src/ short enough to read at once (issue #68 item 6)
SOURCE_LIMIT = 300


def long_sources(root) -> dict[str, int]:
    """{file: lines} of the Python and C++ files under root/src over SOURCE_LIMIT lines."""
    files = [p for ext in ("*.py", "*.h", "*.cpp") for p in (root / "src").rglob(ext)]
    return {str(p.relative_to(root)): n for p in files if (n := len(p.read_text().splitlines())) > SOURCE_LIMIT}


def test_every_source_file_stays_under_the_limit():
    assert not long_sources(ROOT), long_sources(ROOT)


def test_a_long_source_file_is_found(tmp_path):  # negative control
    (tmp_path / "src" / "k").mkdir(parents=True)
    (tmp_path / "src" / "k" / "a.h").write_text("x\n" * 301)
    (tmp_path / "src" / "b.py").write_text("y\n" * 300)
    assert long_sources(tmp_path) == {"src/k/a.h": 301}


# a newcomer's reading (issue #68): the README short, each topic page short, the benchmarks page the
# current figures (history lives in git)
DOC_LIMITS = {"README.md": 300, "docs/benchmarks.md": 600}
PAGE_LIMIT = 400


def doc_lengths(root) -> dict[str, tuple[int, int]]:
    """{page: (lines, limit)} of the README and every page under docs/."""
    pages = ["README.md", *(str(p.relative_to(root)) for p in sorted((root / "docs").glob("*.md")))]
    return {p: (len((root / p).read_text().splitlines()), DOC_LIMITS.get(p, PAGE_LIMIT)) for p in pages}


def test_the_readme_and_the_docs_stay_short():
    over = {p: n for p, (n, limit) in doc_lengths(SRC.parents[1]).items() if n > limit}
    assert not over, over


def test_a_long_page_is_found(tmp_path):  # negative control
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("x\n" * 301)
    (tmp_path / "docs" / "a.md").write_text("y\n" * 10)
    assert doc_lengths(tmp_path) == {"README.md": (301, 300), "docs/a.md": (10, 400)}


# one parser of a spec's ;key=value options (issue #68 item 5): nothing else splits on ';'
OPTION_PARSER = "spec_options.py"
NOT_SPECS = {"server/admission.py"}  # a Content-Type header's parameters, not a spec
_SPLITS = _re.compile(r"""(?:split|partition|rpartition)\(\s*["'];["']""")


def semicolon_splits(root) -> set[str]:
    """Files under `root` (a package) that split text on ';', outside the option parser."""
    return {
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != OPTION_PARSER and str(p.relative_to(root)) not in NOT_SPECS and _SPLITS.search(p.read_text())
    }


def test_only_the_option_parser_splits_a_spec_on_semicolons():
    assert not semicolon_splits(SRC), semicolon_splits(SRC)


def test_a_second_option_parser_is_found(tmp_path):  # negative control
    (tmp_path / "a.py").write_text('path, _, rest = arg.partition(";")\n')
    (tmp_path / "b.py").write_text("x = 1\n")
    assert semicolon_splits(tmp_path) == {"a.py"}
