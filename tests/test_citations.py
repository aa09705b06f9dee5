"""Every citation of a document's section, in code and docs, names a heading that exists.

The tree cites its documents by section: ``DESIGN §3``, ``DESIGN I6`` (an invariant),
``RAFT.md "Member identity"``, ``SECURITY.md, "Peer authentication"``, ``README "Who may
call"``, and, inside a markdown file, ``(above, "Bounded frames")`` or ``"Locks" below`` for
its own sections. Each must resolve to a heading of the file it names:

- ``DESIGN §N`` to a heading ``N. ...`` of DESIGN.md, ``DESIGN IN`` (also in lists and ranges:
  ``I1, I8``, ``I2-I7``) to an invariant heading ``IN. ...``;
- a quoted name to a heading whose text, without markup, is that name, or is that name
  followed by `` (...)`` or `` — ...`` (``deploy/README.md "First start"`` names
  ``## First start (initial_cluster_state)``); case is ignored;
- the file itself must be in the repository: named with its path from the root, or by its
  bare name when it sits beside the citing file, at the root, or nowhere else in the tree.

The notes on pysyncobj that used to live outside the repository are part of
``coordinator/raft/RAFT.md`` now: no file may cite the old notes' file any more.

Headings inside fenced code blocks do not count (a ``# comment`` in a shell example is not a
section). Generated code is not scanned, nor is this file (its own tests cite made-up
sections on purpose). The resolver's own tests below feed it bad citations and show that
it reports them.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Where citations can be: source, docs, manifests. Generated code and build output are not.
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".proto", ".toml", ".yaml", ".yml", ".nft", ".service",
                 ".txt", ".cfg", ".ini", ".sh", ".json"}
TEXT_NAMES = {"Dockerfile", "run"}
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "build", "dist", "node_modules", ".mypy_cache",
             ".ruff_cache", ".pytest_cache", ".hypothesis"}
GENERATED = re.compile(r"_pb2(_grpc)?\.pyi?$")
THIS_FILE = pathlib.Path(__file__).resolve()

# The notes that RAFT.md absorbed (spelled in two pieces so this file does not cite them).
GONE = "PYSYNC" + "OBJ.md"

_INVARIANTS = r"I\d+(?:\s*[-–]\s*I\d+)?(?:\s*,\s*I\d+(?:\s*[-–]\s*I\d+)?)*"
# DESIGN / DESIGN.md, then a section (§N), invariants (I6, I1-I7, I1, I8), or both.
DESIGN_CITATION = re.compile(
    r"\bDESIGN(?:\.md)?`?,?[ \t]*(?:§[ \t]?(?P<section>\d+)(?:\.\d+)?)?[ \t]*(?P<invariants>" + _INVARIANTS + r")?"
)
# A bare § inside DESIGN.md itself.
SELF_SECTION = re.compile(r"(?<![\w.])§[ \t]?(?P<section>\d+)")
# FILE.md (or README), then a quoted heading: RAFT.md "X", `SECURITY.md`, "X", README \"X\".
FILE_CITATION = re.compile(
    r"(?P<file>(?<![\w./-])(?:[\w./-]*/)?[A-Za-z][\w-]*\.md|\bREADME\b(?!\.))`?,?"
    r"(?:[ \t]+|[ \t]*\n[ \t]*(?:#|//|\*)?[ \t]*)"
    r"\\?[\"“](?P<name>[^\"”\\]{1,120})\\?[\"”]"
)
# Inside a markdown file: (above, "X"), (below, "X"), "X" above, "X" below.
SELF_CITATION = re.compile(
    r"\b(?:above|below),\s+\"(?P<name1>[^\"]{1,120})\"|\"(?P<name2>[^\"]{1,120})\"\s+(?:above|below)\b"
)
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _plain(text: str) -> str:
    """Heading or cited text without markup, runs of whitespace (or a comment's line break)
    made one space, lower case."""
    text = re.sub(r"\n[ \t]*(?:#|//|\*)?[ \t]*", " ", text)
    text = re.sub(r"[`*_]", "", text)
    return re.sub(r"\s+", " ", text).strip().lower()


@dataclasses.dataclass(frozen=True)
class Headings:
    names: frozenset[str]  # every name a heading answers to (plain, lower case)
    sections: frozenset[int]  # "3. Invariants" -> 3
    invariants: frozenset[int]  # "I6. Leases use the log clock" -> 6


def headings_of(markdown: str) -> Headings:
    names: set[str] = set()
    sections: set[int] = set()
    invariants: set[int] = set()
    in_fence = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match is None:
            continue
        text = _plain(match.group(2))
        number = re.match(r"(\d+)\.\s+(.*)", text)
        if number:
            sections.add(int(number.group(1)))
            text = number.group(2)
        invariant = re.match(r"i(\d+)\b\.?\s*(.*)", text)
        if invariant:
            invariants.add(int(invariant.group(1)))
        names.add(text)
        for cut in (" (", " — ", " - "):
            if cut in text:
                names.add(text.split(cut, 1)[0])
    return Headings(frozenset(names), frozenset(sections), frozenset(invariants))


def _invariant_numbers(text: str) -> list[int]:
    numbers: list[int] = []
    for part in re.split(r"\s*,\s*", text):
        bounds = [int(n) for n in re.findall(r"I(\d+)", part)]
        if len(bounds) == 2:
            numbers.extend(range(bounds[0], bounds[1] + 1))
        else:
            numbers.extend(bounds)
    return numbers


class Tree:
    """The markdown files of a tree, found by path or bare name, their headings read once."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self._markdown = sorted(p for p in text_files(root) if p.suffix == ".md")
        self._headings: dict[pathlib.Path, Headings] = {}

    def resolve(self, cited: str, citing: pathlib.Path) -> pathlib.Path | None:
        if cited == "README":  # the bare word always means the project's README
            return (self.root / "README.md").resolve() if (self.root / "README.md").is_file() else None
        name = cited
        if "/" in name:
            for base in (self.root, citing.parent):
                if (base / name).is_file():
                    return (base / name).resolve()
            return None
        for base in (citing.parent, self.root):
            if (base / name).is_file():
                return (base / name).resolve()
        found = [p for p in self._markdown if p.name == name]
        return found[0].resolve() if len(found) == 1 else None

    def headings(self, path: pathlib.Path) -> Headings:
        if path not in self._headings:
            self._headings[path] = headings_of(path.read_text(encoding="utf-8"))
        return self._headings[path]


def text_files(root: pathlib.Path) -> list[pathlib.Path]:
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel):
            continue
        if not path.is_file() or GENERATED.search(path.name):
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES:
            found.append(path)
    return found


def unresolved(root: pathlib.Path, files: list[pathlib.Path] | None = None) -> list[str]:
    """One line per citation in ``files`` (default: every text file under ``root`` but this
    one) that names no heading of the file it cites, or cites a file not in the tree."""
    tree = Tree(root)
    problems: list[str] = []
    design = tree.resolve("DESIGN.md", root / "DESIGN.md")
    for path in files if files is not None else [p for p in text_files(root) if p.resolve() != THIS_FILE]:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        rel = path.relative_to(root)

        def where(offset: int, rel: pathlib.Path = rel, text: str = text) -> str:
            return f"{rel}:{text.count(chr(10), 0, offset) + 1}"

        for match in re.finditer(re.escape(GONE), text):
            problems.append(f"{where(match.start())}: cites {GONE}, whose facts are in coordinator/raft/RAFT.md now")
        for match in DESIGN_CITATION.finditer(text):
            section, invariants = match.group("section"), match.group("invariants")
            if section is None and invariants is None:
                continue
            if design is None:
                problems.append(f"{where(match.start())}: cites DESIGN.md, which is not in the repository")
                continue
            known = tree.headings(design)
            if section is not None and int(section) not in known.sections:
                problems.append(f"{where(match.start())}: DESIGN.md has no section §{section}")
            for number in _invariant_numbers(invariants or ""):
                if number not in known.invariants:
                    problems.append(f"{where(match.start())}: DESIGN.md has no invariant I{number}")
        if design is not None and path.resolve() == design:
            for match in SELF_SECTION.finditer(text):
                if int(match.group("section")) not in tree.headings(design).sections:
                    problems.append(f"{where(match.start())}: DESIGN.md has no section §{match.group('section')}")
        for match in FILE_CITATION.finditer(text):
            cited = match.group("file")
            if cited in (GONE, "DESIGN.md"):
                continue  # reported above, and DESIGN.md is cited by § and I
            target = tree.resolve(cited, path)
            if target is None:
                problems.append(
                    f'{where(match.start())}: cites {cited} "{match.group("name")}",'
                    f" but {cited} is not in the repository"
                )
                continue
            if _plain(match.group("name")) not in tree.headings(target).names:
                problems.append(
                    f'{where(match.start())}: {target.relative_to(root)} has no heading "{_plain(match.group("name"))}"'
                )
        if path.suffix == ".md":
            for match in SELF_CITATION.finditer(text):
                name = match.group("name1") or match.group("name2")
                if _plain(name) not in tree.headings(path.resolve()).names:
                    problems.append(
                        f'{where(match.start())}: {rel} has no heading "{_plain(name)}" (cited above/below)'
                    )
    return sorted(problems)


def test_every_citation_names_a_heading_that_exists():
    problems = unresolved(ROOT)
    assert problems == [], "citations that resolve to no heading:\n" + "\n".join(problems)


def test_the_design_has_every_section_and_invariant_the_tree_cites():
    """Not vacuous: DESIGN.md exists and holds §1-§8 and I1-I11, cited across the tree."""
    design = headings_of((ROOT / "DESIGN.md").read_text(encoding="utf-8"))
    assert set(range(1, 9)) <= design.sections
    assert design.invariants == set(range(1, 12))


# -- the resolver's own tests: each kind of citation, broken once ---------------------------


def _tree(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    base = {
        "DESIGN.md": "# Contract\n## 3. Invariants\n### I1. One\n### I2. Two\n## 4. API\n",
        "docs/GUIDE.md": (
            "# Guide\n## First start (once)\n## `python -m x` — what it does\n"
            "```sh\n# Not a heading\n```\nAs said (above, \"First start\").\n"
        ),
    }
    for rel, text in {**base, **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_resolver_passes_good_citations(tmp_path):
    root = _tree(tmp_path, {
        "pkg/a.py": (
            "# DESIGN §3 I1, I2; DESIGN.md §4; DESIGN I1-I2\n"
            "# docs/GUIDE.md, \"First start\" and GUIDE.md \"python -m x\"\n"
            "# see GUIDE.md \"first\n# start\"\n"
        ),
    })
    assert unresolved(root) == []


def test_resolver_reports_each_kind_of_bad_citation(tmp_path):
    root = _tree(tmp_path, {
        "pkg/a.py": (
            "# DESIGN §9\n"
            "# DESIGN I7\n"
            "# DESIGN §3 I1-I3\n"
            "# GUIDE.md \"Last start\"\n"
            "# GUIDE.md \"Not a heading\"\n"
            "# MISSING.md \"Anything\"\n"
            f"# {GONE} \"Durability\"\n"
        ),
        "docs/OTHER.md": "# Other\n(below, \"Nowhere\")\n",
    })
    assert unresolved(root) == [
        "docs/OTHER.md:2: docs/OTHER.md has no heading \"nowhere\" (cited above/below)",
        "pkg/a.py:1: DESIGN.md has no section §9",
        "pkg/a.py:2: DESIGN.md has no invariant I7",
        "pkg/a.py:3: DESIGN.md has no invariant I3",
        "pkg/a.py:4: docs/GUIDE.md has no heading \"last start\"",
        "pkg/a.py:5: docs/GUIDE.md has no heading \"not a heading\"",
        "pkg/a.py:6: cites MISSING.md \"Anything\", but MISSING.md is not in the repository",
        f"pkg/a.py:7: cites {GONE}, whose facts are in coordinator/raft/RAFT.md now",
    ]
