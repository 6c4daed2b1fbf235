"""The manual cannot rot: every `pgt ...` command in the README and docs/ names a command and options that exist
(each subcommand's --help runs, and lists every option the pages use), every page the README links exists, and
every link into a page names one of its headings."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache

from tests.conftest import PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def pgt_commands() -> list[tuple[str, list[str]]]:
    """(page, argv after `pgt`) of every `pgt` line in the pages' bash blocks (continued lines joined)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("  #")[0].strip()
                if line.startswith("pgt "):
                    argv = shlex.split(line)[1:]
                    if "--" in argv:  # `pgt submit ... -- CMD ARGS`: submit's options, then CMD's
                        found.append((page.name, argv[argv.index("--") + 1:]))
                        argv = argv[:argv.index("--")]
                    found.append((page.name, argv))
    return found


@cache
def help_of(command: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-m", "pgt.cli", command, "--help"], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "300", "PATH": ""})
    return r.returncode, r.stdout


def test_the_pages_hold_pgt_commands_of_every_kind():
    commands = {argv[0] for _, argv in pgt_commands()}
    assert {"preprocess", "synth", "train", "tune", "evaluate", "predict", "serve", "explain"} <= commands


def test_every_documented_command_and_option_exists():
    missing = []
    for page, argv in pgt_commands():
        code, text = help_of(argv[0])
        if code != 0:
            missing.append(f"{page}: pgt {argv[0]} (no such command)")
            continue
        for option in (a.split("=")[0] for a in argv[1:] if a.startswith("--")):
            if option not in text:
                missing.append(f"{page}: pgt {argv[0]} {option}")
    assert missing == [], missing


def test_every_linked_page_exists():
    links = re.findall(r"\]\(((?:docs/)?[\w.-]+\.md)\)", (PROJECT_ROOT / "README.md").read_text())
    assert len(links) >= 9 and all((PROJECT_ROOT / link).is_file() for link in links), links


def test_the_architecture_map_names_every_module_and_only_modules_that_exist():
    """ARCHITECTURE.md is the newcomer's map: each module of the packages appears on it by file name, and each
    file name it gives is a module of the project."""
    text = (PROJECT_ROOT / "ARCHITECTURE.md").read_text()
    packages = ("infra", "preprocessing", "pgt", "tune", "flows")
    modules = [p for package in packages for p in (PROJECT_ROOT / package).rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 40
    assert [str(p.relative_to(PROJECT_ROOT)) for p in modules if p.name not in text] == []
    existing = {p.name for p in PROJECT_ROOT.rglob("*.py") if ".venv" not in p.parts}
    assert sorted(set(re.findall(r"\b[a-z_]+\.py\b", text)) - existing) == []


def test_every_test_file_the_pages_code_and_scripts_name_exists():
    """A test file named in the README, docs/, ARCHITECTURE.md or a module's or script's text is a file of the suite
    (a moved test file left the GPU check running nothing)."""
    sources = [*PAGES, PROJECT_ROOT / "ARCHITECTURE.md",
               *(p for folder in ("pgt", "preprocessing", "tune", "flows", "infra", "benchmarks", "scripts")
                 for p in (PROJECT_ROOT / folder).rglob("*") if p.suffix in (".py", ".sh"))]
    named = {(source.relative_to(PROJECT_ROOT), path) for source in sources
             for path in re.findall(r"tests/[\w/]+\.py", source.read_text())}
    assert len(named) >= 5
    assert sorted(f"{source}: {path}" for source, path in named if not (PROJECT_ROOT / path).is_file()) == []


def heading_anchors(text: str) -> set[str]:
    """The fragments a page answers to: each heading as GitHub names it (lower case, punctuation dropped but hyphens,
    spaces as hyphens; a repeated heading gets -1, -2, ...) and each `<a id="...">`."""
    anchors, seen = set(re.findall(r'<a id="([^"]+)"></a>', text)), {}
    for heading in re.findall(r"^#+\s+(.+?)\s*$", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def test_heading_anchors_follow_githubs_names():
    text = "# Training\n## The whole step captured (`--capture-step`)\n## Ensembles\n## Ensembles\n<a id=\"memory\"></a>\n"
    assert heading_anchors(text) == {"training", "the-whole-step-captured---capture-step", "ensembles", "ensembles-1",
                                     "memory"}


def test_every_link_into_a_page_names_a_place_the_page_has():
    broken, links = [], 0
    for page in PAGES:
        for target, fragment in re.findall(r"\]\(([\w./-]*?)#([\w-]+)\)", page.read_text()):
            links += 1
            linked = (page.parent / target).resolve() if target else page
            if not linked.is_file() or fragment not in heading_anchors(linked.read_text()):
                broken.append(f"{page.name}: {target}#{fragment}")
    assert links >= 20 and broken == [], (links, broken)
