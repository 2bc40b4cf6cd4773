"""docs/PAPER.md, the paper's fidelity table: it exists, the README links it,
it has a row for every element of the paper and for every evaluation method, and what it
points at in the code exists (files, and module attributes such as ``budget.plan_fragment``)."""
import importlib
import pathlib
import re

import pytest

# Module paths that no longer exist (folded by pipeline stage): docs must name the new ones.
MOVED = {"vr_runtime." + m for m in (
    "decoders", "routers", "scorers", "policies", "budget", "scales", "latency", "cost_model",
    "prompt", "tiny", "weights", "devices", "decode", "training.synthetic", "atomic",
    "environment", "plot", "timing", "nvml", "memory", "progress", "cli_common")}

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "PAPER.md"


@pytest.fixture(scope="module")
def text():
    assert DOC.is_file(), "docs/PAPER.md is missing"
    return DOC.read_text()


def test_linked_from_the_readme():
    assert "(docs/PAPER.md)" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("element", [
    "Shadow stack", "Semantic Router", "Image Router", "Router input text", "Dynamic budget",
    "Algorithm 1", "Scales", "Stage 1", "Stage 2", "Stage 3", "Frame labels", "Policy labels",
    "InternVL3 Dense", "InternVL3 Budget", "Uniform Pooling", "CLIP Relevance Pooling",
    "Data FT + Uniform Pooling", "Qwen2.5-VL Budget", "w/o Image Router", "w/o Semantic Router",
    "w/o Joint FT", "w/o Pre-train", "Empty fragment", "Budget x frames sweep", "What TTFT is",
    "Latency table rows", "TTFT in evaluation tables"])
def test_every_element_has_a_row(text, element):
    rows = [line for line in text.splitlines() if line.startswith(f"| {element}")]
    assert rows, f"no row for {element!r}"
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert len(cells) == 4 and all(cells), rows[0]   # paper | code | status, none empty
    assert re.search(r"\b(match|deviation|not reproducible|partial)", cells[3]), rows[0]


def test_every_eval_method_is_named(text):
    from vr_runtime.eval.methods import METHODS
    missing = [m for m in METHODS if f"`{m}`" not in text]
    assert not missing, f"methods without a row in docs/PAPER.md: {missing}"


def test_what_it_points_at_exists(text):
    """Every `file.py`/`.json` named exists in the repository, and every `module.attr` whose
    module is a vr_runtime module names an attribute of it: a renamed function breaks this."""
    files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
             and ".git" not in p.parts}
    bad = []
    for tok in re.findall(r"`([^`\s]+)`", text):
        tok = tok.rstrip(",")
        if re.fullmatch(r"[\w./{},-]+\.(py|json)", tok) and "{" not in tok:
            if not any(f == tok or f.endswith("/" + tok) for f in files):
                bad.append(tok)
        m = re.fullmatch(r"([a-z_/0-9]+)\.([A-Za-z_][A-Za-z_0-9]*)", tok)
        if m and not tok.endswith((".py", ".json", ".md")):
            mod = "vr_runtime." + m.group(1).replace("/", ".")
            if mod in MOVED:
                bad.append(tok)                            # an old path of a moved module
                continue
            try:
                module = importlib.import_module(mod)
            except ImportError:
                continue                                   # not a module path (e.g. a field)
            if not hasattr(module, m.group(2)):
                bad.append(tok)
    assert not bad, f"docs/PAPER.md names things that do not exist: {bad}"
    assert "/work/shared" not in text
