"""The house rules of the layout, checked over the source itself: the package is folded by
pipeline stage, imports only run down the floors (no circles, no climbs), functions and classes
stay short, comments say what the code does rather than which issue asked for it, and the tests
mirror the packages."""
import ast
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest floor first. A module may import its own floor and any floor below it, never one
# above: the pipeline's stages sit on the shared pieces (errors, telemetry, video, backbones,
# data), the request on the stages, the runtime on the request, and the front doors (cli_args
# and cli_io, eval, serve, training, the CLI) on the runtime. The tiny model's curriculum
# (vr_tiny) is a package beside vr_runtime on the top floor: it imports vr_runtime, never the
# other way round.
FLOORS = (
    ("vr_kernels",),
    ("vr_runtime", "vr_runtime.errors"),
    ("vr_runtime.telemetry",),
    ("vr_runtime.video", "vr_runtime.backbones"),
    ("vr_runtime.data",),
    ("vr_runtime.routing", "vr_runtime.planning", "vr_runtime.reconstruct", "vr_runtime.generate"),
    ("vr_runtime.request", "vr_runtime.report", "vr_runtime.fingerprint", "vr_runtime.html"),
    ("vr_runtime.runtime",),
    ("vr_runtime.cli_args", "vr_runtime.cli_io"),
    ("vr_runtime.eval", "vr_runtime.serve"),
    ("vr_runtime.training",),
    ("vr_runtime.cli",),
    ("vr_tiny",),
)
MAX_TOP_LEVEL_MODULES = 12
LONG, TOO_LONG, MAX_LONG = 60, 80, 5
MAX_CLASS_LINES = 300
ISSUE_REF = re.compile(r"(?<![a-z])issues?[ _#-]*\d+", re.IGNORECASE)


PACKAGES = ("vr_runtime", "vr_kernels", "vr_tiny")


def _module_files():
    files = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return files


def module_graph():
    """module -> the package modules it imports (function-level imports included)."""
    files = _module_files()
    graph = {m: set() for m in files}
    for m, p in files.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            graph[m].update(t for t in targets if t in files and t != m)
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def floor(module: str, floors=FLOORS) -> int:
    """The floor of the longest prefix that names the module's package or the module."""
    best, best_len = None, -1
    for i, names in enumerate(floors):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = i, len(name)
    if best is None:
        raise AssertionError(f"{module}: on no floor; add it to FLOORS in {__file__}")
    return best


def climbs(graph, floors=FLOORS):
    return sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                  if floor(t, floors) > floor(m, floors))


def test_the_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_circles():
    graph = module_graph()
    assert "vr_runtime.cli_args" in graph and graph["vr_runtime.runtime"]
    assert cycles(graph) == []


def test_the_climb_check_sees_an_upward_import():
    floors = (("low",), ("high",))
    assert climbs({"low.a": {"high.b"}, "high.b": {"low.a"}}, floors) == ["low.a -> high.b"]


def test_no_import_runs_up_a_floor():
    assert climbs(module_graph()) == []


def test_top_level_modules():
    mods = sorted(p.stem for p in (ROOT / "vr_runtime").glob("*.py") if p.name != "__init__.py")
    assert len(mods) <= MAX_TOP_LEVEL_MODULES, mods


def _functions(paths, root=ROOT):
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{p.relative_to(root)}:{node.lineno} {node.name}", \
                    node.end_lineno - node.lineno + 1


def test_functions_are_short():
    lengths = dict(_functions(_module_files().values()))
    too_long = {k: n for k, n in lengths.items() if n > TOO_LONG}
    long = {k: n for k, n in lengths.items() if n > LONG}
    assert not too_long, too_long
    assert len(long) <= MAX_LONG, long


def long_classes(paths, root=ROOT) -> dict:
    """(path:line name) -> lines of each class over MAX_CLASS_LINES, counted from its ``class``
    line to its last line (nested classes too)."""
    out = {}
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    out[f"{p.relative_to(root)}:{node.lineno} {node.name}"] = n
    return out


def test_the_class_length_sees_a_long_class(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import abc\n\n\nclass Big(abc.ABC):\n" + "    x = 1\n" * MAX_CLASS_LINES)
    ok = tmp_path / "ok.py"
    ok.write_text("class Fits:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1) + "\n\ny = 2\n")
    assert long_classes([bad, ok], root=tmp_path) == {"bad.py:4 Big": MAX_CLASS_LINES + 1}


def test_classes_are_short():
    """A class over 300 lines holds more than one idea: split it by meaning (free functions in
    the module of their stage, or a small helper class), not by squeezing lines."""
    assert not long_classes(_module_files().values())


# A function that takes many arguments passes a bundle around loose: a spec object carries what
# travels together. Two public keyword APIs keep their ecosystem's shape: lmms-eval builds its
# model from model_args keywords, and load_video is the decoding entry point's documented call.
MAX_PARAMS, MAX_PRIVATE_PARAMS = 10, 8
WIDE_APIS = {("vr_runtime/eval/lmms_model.py", "__init__"), ("vr_runtime/video/load.py", "load_video")}


def wide_functions(paths, root=ROOT) -> dict:
    """(path:line name) -> parameters of each function over its limit (``self``/``cls`` not
    counted; ``*args`` and ``**kwargs`` one each): MAX_PARAMS, or MAX_PRIVATE_PARAMS for a
    name starting with an underscore (dunders count as public)."""
    out = {}
    for p in paths:
        rel = p.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            n = len(names) + bool(a.vararg) + bool(a.kwarg) - (names[:1] in (["self"], ["cls"]))
            private = node.name.startswith("_") and not node.name.endswith("__")
            if n > (MAX_PRIVATE_PARAMS if private else MAX_PARAMS) and \
                    (rel, node.name) not in WIDE_APIS:
                out[f"{rel}:{node.lineno} {node.name}"] = n
    return out


def test_the_parameter_count_sees_a_wide_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def ok(a, b, c, d, e, f, g, h, i, j):\n    pass\n\n\n"
                 "def wide(a, b, c, d, e, f, g, h, i, j, k):\n    pass\n\n\n"
                 "def _inner(a, b, c, d, e, f, g, h, *rest):\n    pass\n\n\n"
                 "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j):\n        pass\n")
    assert wide_functions([f], root=tmp_path) == {"m.py:5 wide": 11, "m.py:9 _inner": 9}


def test_functions_take_few_parameters():
    """vr_runtime and vr_tiny (vr_kernels' Triton kernels take their pointers and constexprs
    one by one, as Triton asks)."""
    files = [p for m, p in _module_files().items() if not m.startswith("vr_kernels")]
    assert not wide_functions(files)


# bench/ and scripts/: a benchmark is one short script over the shared harness, and a tool
# script reads the same way. "Top-level files" are the entries directly in bench/ that are
# files (a folder such as bench/scripts/ or bench/results/ is not one); hidden entries and
# caches are not part of the tree.
MAX_BENCH_TOP_FILES = 12
TOOL_DIRS = ("bench", "scripts")
SH_FUNC = re.compile(r"^(\s*)(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)\s*\{(.*)$")


def top_level_files(folder: pathlib.Path):
    return sorted(p.name for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix != ".pyc")


def sh_functions(name: str, text: str):
    """(name:line function, lines) of each shell function written ``f() {`` ... ``}``, the
    closing brace alone on its line at the opening line's indent (or on the opening line)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = SH_FUNC.match(line)
        if not m:
            continue
        indent, fname, rest = m.groups()
        if rest.rstrip().endswith("}"):
            yield f"{name}:{i + 1} {fname}", 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == indent + "}"),
                   None)
        if end is None:
            raise AssertionError(f"{name}:{i + 1} {fname}: no closing brace at its indent")
        yield f"{name}:{i + 1} {fname}", end - i + 1


def _tool_files(suffix):
    return [p for d in TOOL_DIRS for p in (ROOT / d).rglob(f"*{suffix}")
            if "__pycache__" not in p.parts and "results" not in p.relative_to(ROOT).parts]


def test_the_top_level_count_sees_only_files(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / ".pytest_cache").mkdir()
    for name in ("a.py", "b.sh", "README.md", ".hidden"):
        (tmp_path / name).write_text("")
    assert top_level_files(tmp_path) == ["README.md", "a.py", "b.sh"]


def test_bench_holds_few_top_level_files():
    files = top_level_files(ROOT / "bench")
    assert len(files) <= MAX_BENCH_TOP_FILES, files


def test_the_shell_function_length_sees_a_long_function():
    body = "\n".join(f"    echo {i}" for i in range(TOO_LONG))
    text = f"short() {{ echo hi; }}\nlong() {{  # a comment\n{body}\n}}\nx=1\n"
    assert dict(sh_functions("t.sh", text)) == {"t.sh:1 short": 1, "t.sh:2 long": TOO_LONG + 2}


def test_the_python_function_length_sees_a_long_function(tmp_path):
    p = tmp_path / "bench_x.py"
    p.write_text("def f():\n" + "    x = 1\n" * TOO_LONG)
    (k, n), = _functions([p], root=tmp_path)
    assert k == "bench_x.py:1 f" and n == TOO_LONG + 1 > TOO_LONG


def test_bench_and_scripts_functions_are_short():
    lengths = dict(_functions(_tool_files(".py")))
    for p in _tool_files(".sh"):
        lengths.update(sh_functions(str(p.relative_to(ROOT)), p.read_text()))
    assert any(k.startswith("bench/scripts/bench_e2e.py") for k in lengths)
    assert any(k.startswith("bench/gpu_run.sh") for k in lengths)
    too_long = {k: n for k, n in lengths.items() if n > TOO_LONG}
    assert not too_long, too_long


def test_the_issue_pattern():
    for text in ("issue 21", "Issue #7", "(issue 3 item 1)", "gpu_issue21.sh", "issues 32-35"):
        assert ISSUE_REF.search(text), text
    for text in ("an issue with the clock", "issues of decoding", "tissue 4"):
        assert not ISSUE_REF.search(text), text


def test_no_issue_numbers_in_code_bench_or_scripts():
    tracked = subprocess.run(["git", "ls-files", *PACKAGES, "bench", "scripts"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in tracked:
        p = ROOT / name
        if not p.is_file() or p.suffix not in (".py", ".sh", ".md", ".json", ".yaml", ".txt"):
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if ISSUE_REF.search(line):
                hits.append(f"{name}:{i}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_tests_mirror_the_packages():
    packages = sorted(p.parent.name for p in (ROOT / "vr_runtime").glob("*/__init__.py"))
    missing = [p for p in packages if not (ROOT / "tests" / p).is_dir()]
    assert not missing, f"no tests/<package> folder for {missing}"
    assert (ROOT / "tests" / "kernels").is_dir() and (ROOT / "tests" / "tiny").is_dir()


MAX_SHIMS = 2
SHIM = re.compile(r"\bDeprecationWarning\b")


def shims(files) -> list:
    """Places in the package sources that raise a DeprecationWarning (a kept old name)."""
    out = []
    for p in files:
        for n, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if SHIM.search(code) and "warn" in code:
                out.append(f"{p.relative_to(ROOT)}:{n}")
    return out


def test_the_shim_check_sees_a_shim(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import warnings\nwarnings.warn('old', DeprecationWarning)\n")
    ok = tmp_path / "ok.py"
    ok.write_text("# a DeprecationWarning in a comment is no shim\nx = 1\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert shims([bad, ok]) == ["bad.py:2"]
    finally:
        ROOT = saved


def test_at_most_two_deprecation_shims():
    """Pre-1.0, no downstream user to protect: old names are removed, not kept (CHANGELOG.md
    lists them)."""
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    found = shims(files)
    assert len(found) <= MAX_SHIMS, found
    assert not (ROOT / "vr_runtime" / "_aliases.py").exists()


REPO_PATHS = ("bench/", "studies/", "scripts/", "tests/", "docs/")


def repo_path_defaults(tree):
    """String defaults (of a function's parameters or an argparse ``default=``) that name a
    folder of this repository: a package installed from a wheel has none of them."""
    hits = []
    for node in ast.walk(tree):
        values = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            values = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        elif isinstance(node, ast.Call):
            values = [k.value for k in node.keywords if k.arg == "default"]
        hits += [v.value for v in values if isinstance(v, ast.Constant)
                 and isinstance(v.value, str) and v.value.startswith(REPO_PATHS)]
    return hits


def test_the_default_check_sees_a_repo_path():
    tree = ast.parse("def f(out='bench/results'): pass\np.add_argument('--x', default='studies/a')")
    assert repo_path_defaults(tree) == ["bench/results", "studies/a"]


def test_no_repo_paths_as_package_defaults():
    hits = {str(p.relative_to(ROOT)): repo_path_defaults(ast.parse(p.read_text()))
            for p in _module_files().values()}
    assert not {k: v for k, v in hits.items() if v}


# An ffmpeg started with a terminal on stdin sets the terminal up for its keyboard commands; in a
# background process group that stops it (SIGTTOU) until a timeout kills it. Every ffmpeg command
# line here says -nostdin.
FFMPEG_CALL = re.compile(r"""\[\s*["']ffmpeg["']\s*,(?!\s*["']-nostdin["'])""")


def ffmpeg_without_nostdin(text: str) -> int:
    return len(FFMPEG_CALL.findall(text))


def test_the_ffmpeg_check_sees_a_call_without_nostdin():
    assert ffmpeg_without_nostdin('run(["ffmpeg", "-v", "error", "-i", p])') == 1
    assert ffmpeg_without_nostdin("run(['ffmpeg',\n  '-i', p])") == 1
    assert ffmpeg_without_nostdin('run(["ffmpeg", "-nostdin", "-v", "error"])') == 0


def test_every_ffmpeg_call_says_nostdin():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    hits = [n for n in tracked if n != "tests/test_layout.py" and (ROOT / n).is_file()
            and ffmpeg_without_nostdin((ROOT / n).read_text(errors="replace"))]
    assert not hits, f"ffmpeg without -nostdin in {hits}"
