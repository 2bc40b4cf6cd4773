"""Docs that match the code: the contract lives in the repository
(docs/CONTRACT.md) and nothing points outside it; links between the markdown files resolve;
the training README opens with a quick start whose commands name real configs and keys;
scripts/tiny/train_tiny.sh touches the shipped weights and studies/results only with --install;
and docs/answering.md's synopsis and docs/training.md's defaults match the code."""
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "CONTRACT.md"


def _repo_files():
    """Tracked files plus new ones git does not ignore: what a clone (or the next commit) has."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / f for f in out if f and (ROOT / f).is_file()]


def _text(path):
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def test_nothing_points_outside_the_repository():
    # The patterns are built so that this file does not match itself.
    bad = [re.compile(p) for p in (r"\.\./" + "shared", "shared/" + "SPEC", "SPEC" + r"\.md",
                                   r"\bSPEC" + r" (section )?\d", "seeds/" + "000_")]
    hits = []
    for f in _repo_files():
        text = _text(f)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(b.search(line) for b in bad):
                hits.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_contract_sections_cited_exist():
    headings = set(re.findall(r"^## (\d+)\. ", CONTRACT.read_text(), re.M))
    assert headings >= {str(i) for i in range(8)}
    cited = {}
    for f in _repo_files():
        text = _text(f)
        for m in re.finditer(r"CONTRACT\.md sections? (\d+)(?: to (\d+))?", text or ""):
            for n in filter(None, m.groups()):
                cited.setdefault(n, str(f.relative_to(ROOT)))
    assert cited, "nothing cites docs/CONTRACT.md"
    missing = {n: f for n, f in cited.items() if n not in headings}
    assert not missing, missing


def test_eval_help_cites_no_outside_spec():
    from vr_runtime.eval.cli import build_parser
    text = build_parser().format_help()
    assert "SPEC" not in text and "shared" not in text


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _with_snippets(path: pathlib.Path) -> str:
    """A page's text with the files it includes (``--8<-- "FILE"``, mkdocs' snippets, paths
    from the repository root) in place: docs/benchmarks.md is BENCHMARKS.md on the site."""
    return re.sub(r'^--8<-- "([^"]+)"$', lambda m: (ROOT / m.group(1)).read_text(),
                  path.read_text(), flags=re.M)


def test_markdown_links_resolve():
    link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
    bad = []
    for f in _repo_files():
        if f.suffix != ".md" or "egg-info" in str(f):
            continue
        for target in link.findall(_text(f) or ""):
            if re.match(r"[a-z]+:", target):       # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                bad.append(f"{f.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", _with_snippets(dest), re.M)}
                if anchor not in slugs:
                    bad.append(f"{f.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_training_readme_opens_with_a_quick_start():
    text = (ROOT / "vr_runtime" / "training" / "README.md").read_text()
    first = re.search(r"^## (.+)$", text, re.M).group(1)
    assert first.startswith("Quick start")
    quick = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick start") + 5)]
    assert "--policy auto` needs Stages 1 and 2" in quick and "--routers" in quick
    assert "synth --out" in quick and "videorouter ask" in quick
    # every --config and --set key of the quick start is a real config and one of its keys (the
    # tiny model's configs: vr_tiny's, known once it is imported)
    import vr_tiny  # noqa: F401
    from vr_runtime.training.config import load_config
    for cmd in re.findall(r"stage --config (\S+) --set((?:.|\\\n)*?)(?:\n(?!\s)|$)", quick):
        name, sets = cmd
        cfg = load_config(name)
        keys = re.findall(r"'?([a-z_]+)=", sets)
        assert keys, sets
        for k in keys:
            assert hasattr(cfg, k), (name, k)
    assert len(text.splitlines()) < 260                  # the studies live in docs/
    studies = (ROOT / "docs" / "TRAINING_STUDIES.md").read_text()
    for h in ("Rule (a) on the synthetic task", "Stage 0: a tiny model that sees",
              "Shipped tiny weights"):
        assert f"## {h}" in studies and f"## {h}" not in text


def test_train_tiny_writes_the_checkout_only_with_install(tmp_path, run_train_tiny):
    work = str(tmp_path / "work")
    p, calls = run_train_tiny(tmp_path / "plain", work)
    assert p.returncode == 0, p.stderr
    flat = [a for c in calls for a in c]
    assert "--ship" not in flat and not any(r in a for a in flat for r in ("bench/results", "studies/results"))
    assert calls[0][calls[0].index("--results") + 1] == f"{work}/results"
    assert calls[0][calls[0].index("--work") + 1] == work

    p, calls = run_train_tiny(tmp_path / "install", "--install", work)
    assert p.returncode == 0, p.stderr
    assert "--ship" in calls[0] and calls[0][calls[0].index("--results") + 1] == "studies/results/shipped_v9"
    assert calls[1][:2] == ["-m", "vr_tiny"] and "routing-eval" in calls[1]

    p, calls = run_train_tiny(tmp_path / "typo", "--instal")
    assert p.returncode == 2 and "unknown option --instal" in p.stderr and calls == []


def test_site_navigation_lists_every_page():
    """mkdocs.yml's nav names every page under docs/ and nothing else, and README.md links every
    page, so the front door and the site show the same set (mkdocs build --strict, run by .ci/run,
    checks the links and anchors themselves)."""
    nav = re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages
    readme = (ROOT / "README.md").read_text()
    missing = [p for p in pages if p != "index.md" and f"(docs/{p}" not in readme]
    assert not missing, missing
    assert len(readme.splitlines()) <= 200              # the front door; the rest is in docs/


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("## Run the tests"):]
    command = re.search(r"```bash\n(.+?)\n```", block, re.S).group(1).strip()
    assert command.startswith("bash scripts/ci/setup_tests.sh && ")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci


def test_benchmarks_page_includes_the_record():
    """docs/benchmarks.md is BENCHMARKS.md on the site (mkdocs' snippets), not a copy of it."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page.startswith('--8<-- "BENCHMARKS.md"\n')
    assert "pymdownx.snippets" in (ROOT / "mkdocs.yml").read_text()


def _ask_parser():
    """The ``ask`` subcommand's parser as ``videorouter ask --help`` prints it (no subprocess)."""
    import argparse
    from vr_runtime.cli import build_parser
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["ask"]


def test_answering_synopsis_names_every_ask_flag():
    """docs/answering.md opens with the synopsis of ``videorouter ask``: every option that
    ``ask --help`` lists is in it, and it names no option that ``ask`` lacks."""
    text = (ROOT / "docs" / "answering.md").read_text()
    synopsis = re.search(r"^```\n(videorouter ask .+?)^```", text, re.S | re.M)
    assert synopsis, "docs/answering.md: no ``` block opening with 'videorouter ask'"
    synopsis = synopsis.group(1)
    flags = {o for a in _ask_parser()._actions for o in a.option_strings
             if o.startswith("--") and o != "--help"}
    assert {"--model", "--long-prompt", "--neighbour-window"} <= flags   # the parser was found
    missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])",
                                                        synopsis))
    assert not missing, ("docs/answering.md's synopsis lacks these `videorouter ask` flags: "
                         + ", ".join(missing))
    stale = sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", synopsis)) - flags)
    assert not stale, ("docs/answering.md's synopsis names flags `videorouter ask` does not "
                       "have: " + ", ".join(stale))


def test_training_page_names_train_tiny_default():
    """docs/training.md says which recipe and folder scripts/tiny/train_tiny.sh defaults to."""
    script = (ROOT / "scripts" / "tiny" / "train_tiny.sh").read_text()
    task = re.search(r"^TASK=(v\d+)$", script, re.M).group(1)
    page = (ROOT / "docs" / "training.md").read_text()
    assert f"--task {task}`, the default" in page and f"default `runs/tiny_{task}`" in page, task
