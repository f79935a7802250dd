"""The installed package as a user meets it: one error hierarchy, the public names the docs send users to,
and the product apart from its harnesses."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import re
import warnings
from pathlib import Path

import pytest
import tomllib

from mps_backend.errors import InternalError, MPSBackendError, MPSBackendWarning

ROOT = Path(__file__).resolve().parents[1]


def installed_packages() -> list[str]:
    """The packages pyproject.toml installs (the flatc bindings aside: generated code)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return [p for p in config["packages"] if ".generated" not in p]


def installed_modules() -> list[str]:
    """Every module of the installed package, imported (their import is what a user's import does)."""
    names = []
    for package in installed_packages():
        names.append(package)
        pkg = importlib.import_module(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.ispkg]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            importlib.import_module(name)
    return names


def test_every_exception_and_warning_class_derives_from_the_base():
    classes = {
        f"{name}.{cls.__name__}": cls
        for name in installed_modules()
        for cls in vars(importlib.import_module(name)).values()
        if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == name
    }
    assert "mps_backend.backend.LoweringError" in classes and "mps_backend.errors.CheckpointError" in classes
    assert "mps_backend.serialization.errors.MPSFormatError" in classes, sorted(classes)
    stray = [
        n
        for n, c in classes.items()
        if not (issubclass(c, MPSBackendWarning) if issubclass(c, Warning) else issubclass(c, MPSBackendError))
    ]
    assert not stray, f"not under MPSBackendError / MPSBackendWarning: {stray}"
    # the builtin bases user code may catch are kept
    from mps_backend.backend import LoweringBug, LoweringError
    from mps_backend.errors import CheckpointError
    from mps_backend.runtime.emulator import EmulatorError, InputMismatchError

    assert issubclass(CheckpointError, ValueError) and issubclass(LoweringError, RuntimeError)
    assert issubclass(InputMismatchError, EmulatorError) and issubclass(InputMismatchError, ValueError)
    assert issubclass(LoweringBug, InternalError) and not issubclass(CheckpointError, InternalError)


def _warn_category(call: ast.Call, namespace: dict) -> type | None:
    """The category a ``warnings.warn(...)`` call emits, resolved in its module's namespace."""
    expr = next((k.value for k in call.keywords if k.arg == "category"), call.args[1] if len(call.args) > 1 else None)
    if expr is None and call.args and isinstance(call.args[0], ast.Call):
        expr = call.args[0].func  # warnings.warn(SomeWarning("..."))
    if expr is None:
        return UserWarning
    return eval(compile(ast.Expression(expr), "<category>", "eval"), namespace)  # a name or attribute


def test_every_warning_the_package_emits_is_a_project_warning():
    emitted = []
    for name in installed_modules():
        module = importlib.import_module(name)
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("warnings.warn", "warn"):
                namespace = {**vars(module), "warnings": warnings}
                emitted.append((f"{name}:{node.lineno}", _warn_category(node, namespace)))
    assert len(emitted) >= 6, emitted
    stray = [where for where, cat in emitted if not (inspect.isclass(cat) and issubclass(cat, MPSBackendWarning))]
    assert not stray, f"warnings.warn without an MPSBackendWarning category: {stray}"


def test_the_cli_turns_every_project_error_into_one_line(capsys, monkeypatch):
    from mps_backend.backend import LoweringBug
    from mps_backend.runtime.core import DeviceError
    from mps_backend.tools import cli

    for error, status, prefix in (
        (
            DeviceError("the graph aborts", 3, "gather"),
            2,
            "error: the MPS delegate failed on the device model: node 3 (gather): the graph aborts",
        ),
        (LoweringBug("node x (aten.add): no lowering"), 1, "internal error (a bug of mps_backend"),
    ):

        def ops(args, error=error):
            raise error

        monkeypatch.setattr(cli, "cmd_ops", ops)
        assert cli.main(["ops"]) == status
        err = capsys.readouterr().err
        assert err.startswith(prefix) and err.count("\n") == 1, err


FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
PYTHON_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_snippets(markdown: Path) -> list[str]:
    return PYTHON_FENCE.findall(markdown.read_text())


def resolve(dotted: str) -> object:
    """The object ``mps_backend.a.b.c`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)  # AttributeError: the name does not exist
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_package_exports_what_the_readme_imports_from_it():
    import mps_backend

    imported = {}
    for snippet in python_snippets(ROOT / "README.md"):
        for node in ast.walk(ast.parse(snippet)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mps_backend":
                for alias in node.names:
                    imported[f"{node.module}.{alias.name}"] = (node.module, alias.name)
    assert "mps_backend.MPSPartitioner" in imported and len(imported) >= 5, imported
    for module, name in imported.values():
        exported = importlib.import_module(module).__all__
        assert name in exported, f"the README imports {name} from {module}, whose __all__ lacks it"
    # what the README, the docs and the package's own messages send users to call is exported at the top
    for name in ("export_model", "make_static", "edge_compile_config", "PartitionReport", "LoweringError", "MPSBackendError"):
        assert name in mps_backend.__all__, name
    for name in mps_backend.__all__:
        assert getattr(mps_backend, name) is not None and name in dir(mps_backend), name
    for name in (n for n in mps_backend.__all__ if n != "__version__"):
        obj = getattr(mps_backend, name)
        assert obj is resolve(f"{obj.__module__}.{name}"), name


def imported_names(path: Path, package: str = "") -> list[tuple[int, str]]:
    """Every module an ``import`` statement of the file names, at any depth (lazy imports too), absolute
    (relative imports resolved against ``package``, the file's package)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the installed package name
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def installed_files() -> dict[str, Path]:
    """Installed module name -> its source file (``mps_backend.operators`` is ./operators, ...)."""
    return {name: Path(importlib.import_module(name).__file__) for name in installed_modules()}


#: the lowering pipeline: exported program -> MP00 blob
PIPELINE = (
    "mps_backend.backend",
    "mps_backend.builder",
    "mps_backend.partitioner",
    "mps_backend.simplify",
    "mps_backend.compile_specs",
    "mps_backend.dtypes",
    "mps_backend.errors",
    "mps_backend.passes",
    "mps_backend.operators",
    "mps_backend.serialization",
)
#: what the pipeline must not import: the CLI and tooling, the LLM path, the device model and emulator
ABOVE_THE_PIPELINE = ("mps_backend.tools", "mps_backend.llm", "mps_backend.runtime", "mps_backend.export")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_layering_the_product_imports_no_harness_and_the_pipeline_nothing_above_it():
    files = installed_files()
    assert "harness" not in {p.split(".")[0] for p in installed_packages()}
    assert not any(_within(n, ("mps_backend.tools.zoo", "mps_backend.tools.run_suite")) for n in files)
    harness_or_pytest, upward = [], []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for line, imported in imported_names(path, package):
            where = f"{name}:{line} imports {imported}"
            if _within(imported, ("pytest", "_pytest", "harness")):
                harness_or_pytest.append(where)
            if _within(name, PIPELINE) and _within(imported, ABOVE_THE_PIPELINE):
                upward.append(where)
    assert not harness_or_pytest, harness_or_pytest
    assert not upward, upward
    # the check sees imports at any depth: the harness does import pytest
    assert any(n == "pytest" for _, n in imported_names(ROOT / "harness" / "suite_flow.py"))


def source_modules() -> dict[str, Path]:
    """Every module of the package's source folders (pyproject.toml's ``package-dir``: ./mps_backend,
    ./operators as ``mps_backend.operators``, ./serialization as ``mps_backend.serialization``), by its
    installed name, read from the files (nothing imported); the generated flatc bindings aside."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for top, folder in sorted(dirs.items(), key=lambda kv: -len(kv[0])):  # operators/serialization first
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / folder).parts
            package = ".".join((top, *rel))
            if "generated" in rel or package in found:
                continue
            found[package] = init
            for f in sorted(init.parent.glob("*.py")):
                if f.name != "__init__.py":
                    found[f"{package}.{f.stem}"] = f
    return found


def import_statements(modules: dict[str, Path]) -> list[tuple[str, str, int, bool]]:
    """(importer, imported module of ``modules``, line, function-local?) for every import statement of
    the package's own modules, at any depth (``if TYPE_CHECKING:`` blocks aside: they never run); a
    name imported from a package is its submodule when there is one, else the package."""

    def resolve(name: str) -> str | None:
        if ".generated" in name:  # flatc's bindings: not the package's own code
            return None
        while name not in modules:
            if "." not in name:
                return None
            name = name.rpartition(".")[0]
        return name

    found = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(node, local: bool, name=name, package=package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                targets = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parent = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                        base = f"{parent}.{base}" if base else parent
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
                for target in targets:
                    resolved = resolve(target)
                    if resolved is not None and resolved != name:
                        found.append((name, resolved, child.lineno, local))
                visit(child, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text()), False)
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: its strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
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

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_no_import_circle_in_the_package():
    """#44: the package's modules import each other in one direction only, counting imports at any depth (a
    function-local import closes a circle as surely as a module-level one), and the family modules the LLM
    export imports by their registered name (mps_backend.llm.registry) as imported by it."""
    from mps_backend.llm.registry import FAMILIES

    modules = source_modules()
    assert {"mps_backend.passes.precision", "mps_backend.operators.registry", "mps_backend.serialization.reader"} <= set(modules)
    edges: dict[str, set[str]] = {}
    for importer, imported, _, _ in import_statements(modules):
        edges.setdefault(importer, set()).add(imported)
    for reg in FAMILIES:
        assert reg.module in modules, f"registered family module {reg.module} does not exist"
        edges.setdefault("mps_backend.llm.export", set()).add(reg.module)
    assert circles(edges) == []
    # the check finds a circle, through any number of modules
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_local_imports_between_package_modules_only_defer_a_heavy_dependency():
    """#44: a module imports the package's modules it uses at its top, except to defer a heavy optional
    dependency: a function-local import of a package module is allowed only where that module (with what
    it imports at module level) brings a third-party package that ``import mps_backend`` does not load
    (transformers, tokenizers, gguf, ...) and the importing module does not bring already."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run(
        [sys.executable, "-c", "import sys, mps_backend; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    loaded = set(done.stdout.split())
    assert {"torch", "executorch"} <= loaded, loaded
    modules = source_modules()

    def third_party(path: Path) -> set[str]:  # top-level packages imported at module level, not loaded already
        names = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        ours = ("mps_backend", "__future__")
        return {n for n in names if n not in loaded and n not in sys.stdlib_module_names and n not in ours}

    statements = import_statements(modules)
    top_level: dict[str, set[str]] = {}
    for importer, imported, _, local in statements:
        if not local:
            top_level.setdefault(importer, set()).add(imported)

    def brings(module: str) -> set[str]:  # what importing ``module`` loads beyond ``import mps_backend``
        seen, todo, out = set(), [module], set()
        while todo:
            m = todo.pop()
            if m in seen:
                continue
            seen.add(m)
            out |= third_party(modules[m])
            parts = m.split(".")
            todo += [".".join(parts[:i]) for i in range(1, len(parts))] + sorted(top_level.get(m, ()))
        return out

    deferred = [(importer, imported, line) for importer, imported, line, local in statements if local]
    needless = [f"{i}:{line} imports {m}" for i, m, line in deferred if not brings(m) - brings(i)]
    assert needless == [], needless


def test_one_meaning_per_dtype_table_and_per_check_name():
    from mps_backend import dtypes, runtime_kernels
    from mps_backend.runtime import core, program_check
    from mps_backend.serialization import device_facts

    # torch dtypes the lowering emits (dtypes.DEVICE_DTYPES) map into the serialized types the device
    # creates (device_facts.DEVICE_DATATYPES), which are exactly what the device model holds (core.DEVICE_DTYPE)
    assert dtypes.DEVICE_DTYPES == frozenset(dtypes.TORCH_TO_MPS) == frozenset(core.BINARY_DTYPES)
    assert set(dtypes.TORCH_TO_MPS.values()) <= device_facts.DEVICE_DATATYPES == frozenset(core.DEVICE_DTYPE)
    assert dtypes.FLOAT_DTYPES <= dtypes.DEVICE_DTYPES
    # one definition of each table: the device model imports the float set, nothing redefines it
    for name in installed_modules():
        tree = ast.parse(Path(importlib.import_module(name).__file__).read_text())
        for node in tree.body:
            targets = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            for table in ("FLOAT_DTYPES", "DEVICE_DTYPES"):
                assert table not in targets or name == "mps_backend.dtypes", f"{name} defines its own {table}"
    # "check_program" is the format check of a .pte; the kernel-availability check is check_kernels
    assert callable(program_check.check_program) and callable(runtime_kernels.check_kernels)
    assert not hasattr(runtime_kernels, "check_program")


ARCHITECTURE = ROOT / "docs" / "architecture.md"
SPAN = re.compile(r"`([^`\n]+)`")
#: a span naming a file or folder of the repository
FILE_SPAN = re.compile(r"^[\w.-]+(/[\w.-]+)*(/|\.(py|fbs|cpp|json|md|toml))$")
#: a span naming code: a dotted name, maybe called (`run_pte(pte, inputs) -> list[Tensor]`)
CODE_SPAN = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(.*)?(\s*->.*)?$")
#: "`path.py` `name`, `name`": names the doc places in that file
PLACED = re.compile(r"`([\w./-]+\.py)`((?:,? `[A-Za-z_]\w*`)+)")
#: names of torch, executorch and the OS the doc mentions, and spans that are values rather than names
NOT_OURS = set(
    """
    to_edge_transform_and_lower to_edge to_backend to_executorch compile_config CapabilityBasedPartitioner
    tag_constant_data torch.export executorch.export ExportRecipe get_recipe session.run_method sys.meta_path
    madvise MADV_PAGEOUT BackendDetails OpOverload call_function node.meta executorch.backends.apple.mps
    mpsgraph.MPSGraph mpsgraph MP00 PTMF program.fbs flatc tolist mps_0 mps_1 flow_mps mps mps_fp16 constant_buffer
    constant_buffer_size segment_offset input_ids input3_id padding_idx graph_type metal_kernel alpha step
    faithful aten hf llama execute upstream_pte_dir export inspect run generate debug ops zoo preserve Tensor
    MPSMin MPSMax MPSAtan2 ne floor ceil hardtanh permute adaptive_max_pool2d not(eq)
    torch.topk torch.sort as_strided_copy median.dim MPSCast down_proj linalg_vector_norm native_group_norm
    native_layer_norm var_mean nn.TransformerEncoder
    """.split()
)


def defined_names(paths) -> set[str]:
    """Functions, classes, parameters and assigned names (any depth) of the given Python files."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names |= {a.arg for a in node.args.args + node.args.kwonlyargs}
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return names


def _python_files(path: Path) -> list[Path]:
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def test_architecture_doc_names_only_what_exists():
    text = FENCE.sub("", ARCHITECTURE.read_text())
    ours = [ROOT / d for d in ("mps_backend", "operators", "serialization", "harness", "scripts", "tests")]
    sources = [f for d in ours for f in d.rglob("*.py") if "generated" not in f.parts]
    everything = defined_names(sources) | {f.stem for f in sources} | set(dir(builtins))
    code_text = "\n".join(f.read_text() for f in sources)
    missing, misplaced = [], []
    bases = [ROOT]
    for line in text.splitlines():
        if line.startswith("## "):  # "## The device model (`mps_backend/runtime/`)": its files are relative to it
            bases = [ROOT / s for s in SPAN.findall(line) if FILE_SPAN.match(s)] + [ROOT]
        for span in SPAN.findall(line):
            if span in NOT_OURS:
                continue
            if re.fullmatch(r"MPS_\w+", span) and span.isupper():  # an environment variable the code reads
                if f'"{span}"' not in code_text:
                    missing.append(span)
            elif FILE_SPAN.match(span):
                if "/" in span.rstrip("/"):
                    found = any((b / span).exists() for b in bases)
                else:  # a bare file name of a table row (`core.py`) or a test (`test_passes.py`)
                    found = any((b / span).exists() for b in bases) or any(next(d.rglob(span), None) for d in ours if d.is_dir())
                if not found:
                    missing.append(span)
            elif m := CODE_SPAN.match(span):
                dotted = m.group(1)
                if dotted.split(".")[0] == "mps_backend":
                    try:
                        resolve(dotted)
                    except (ImportError, AttributeError):
                        missing.append(span)
                elif not all(part in everything or part in NOT_OURS for part in dotted.split(".")):
                    missing.append(span)
        for path, names in PLACED.findall(line):
            files = [f for b in bases if (b / path).exists() for f in _python_files(b / path)]
            here = defined_names(files[:1] or files)
            misplaced += [f"{path} {n}" for n in re.findall(r"`(\w+)`", names) if files and n not in here]
    assert not missing, f"docs/architecture.md names what does not exist: {sorted(set(missing))}"
    assert not misplaced, f"docs/architecture.md places names in files that do not define them: {misplaced}"


def environment_reads() -> dict[str, set[str]]:
    """Environment variable -> files that read it (``os.environ.get/[]``, ``os.getenv``, ``env_bytes``,
    ``env_path``, ``NAME in os.environ``; a module-level string constant as the name counts as its value)."""
    reads: dict[str, set[str]] = {}
    folders = ("mps_backend", "operators", "serialization", "harness", "scripts", "benchmarks", "examples", "tests")
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            consts = {
                t.id: n.value.value
                for n in tree.body
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                for t in n.targets
                if isinstance(t, ast.Name)
            }

            def name_of(expr, consts=consts):
                if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
                    return expr.value
                return consts.get(expr.id) if isinstance(expr, ast.Name) else None

            for node in ast.walk(tree):
                key = None
                if isinstance(node, ast.Call) and node.args:
                    func = ast.unparse(node.func)
                    if func in ("os.environ.get", "os.getenv", "environ.get", "env_bytes", "env_path"):
                        key = name_of(node.args[0])
                elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
                    if isinstance(node.ctx, ast.Load):
                        key = name_of(node.slice)
                if key and path.name != "test_package.py":
                    reads.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    return reads


def test_readme_configuration_table_lists_every_environment_variable_the_code_reads(monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {name for cell in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}
    read = environment_reads()
    assert {"MPS_BACKEND_CACHE_DIR", "MPS_BACKEND_MAX_PLAN_BYTES", "MPS_SUITE_WHOLE_PROGRAM"} <= set(read), read
    assert set(read) - listed == set(), f"read by the code, missing in README's Configuration: {set(read) - listed}"
    assert listed - set(read) == set(), f"in README's Configuration, read nowhere: {listed - set(read)}"
    # the byte budgets are parsed one way: a bad value is one ConfigError naming the variable
    from mps_backend.config import ConfigError
    from mps_backend.runtime.core import max_tensor_bytes
    from mps_backend.runtime.program_check import max_plan_bytes

    for name, read_budget in (("MPS_BACKEND_MAX_TENSOR_BYTES", max_tensor_bytes), ("MPS_BACKEND_MAX_PLAN_BYTES", max_plan_bytes)):
        monkeypatch.setenv(name, "1_000")
        assert read_budget() == 1000
        monkeypatch.setenv(name, "")
        assert read_budget() == 4 << 30
        for bad in ("4GiB", "-1", "0"):
            monkeypatch.setenv(name, bad)
            with pytest.raises(ConfigError, match=name):
                read_budget()


def test_importing_the_package_prints_nothing():
    """A user's ``import mps_backend`` (and so every CLI command) is silent: torchao's enum notice under
    torch 2.14 is dropped, and nothing else is printed. Fails if the filter stops matching the notice."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run([sys.executable, "-c", "import mps_backend"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", done.stderr[-2000:]
