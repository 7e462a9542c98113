"""docs/ARCHITECTURE.md cannot drift from the code: its reason-code table lists exactly
the codes of `controller.types.Reason`, and code cites the in-repository document only."""

from __future__ import annotations

import re
from pathlib import Path

from controller.types import Reason

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def documented_codes(text: str) -> list[str]:
    """The codes in the first column of the table between the reason-codes markers."""
    start, end = "<!-- reason-codes:start -->", "<!-- reason-codes:end -->"
    assert start in text and end in text, "reason-code markers missing in the document"
    table = text[text.index(start) : text.index(end)]
    return re.findall(r"^\| `([A-Z_]+)` \|", table, flags=re.M)


def test_reason_code_table_matches_the_enum() -> None:
    codes = documented_codes(DOC.read_text())
    assert len(codes) == len(set(codes)), "a reason code is listed twice"
    missing = sorted({r.value for r in Reason} - set(codes))
    unknown = sorted(set(codes) - {r.value for r in Reason})
    assert not missing, f"add these reason codes to docs/ARCHITECTURE.md: {missing}"
    assert not unknown, f"not reason codes (any more): {unknown}"


def test_the_table_check_sees_a_missing_code() -> None:
    text = DOC.read_text()
    codes = documented_codes(text)
    dropped = text.replace(f"| `{codes[0]}` |", "| dropped |", 1)
    assert codes[0] not in documented_codes(dropped)


def test_code_cites_only_the_document_in_the_repository() -> None:
    """A reader of the repository must be able to follow every cite: `ARCHITECTURE.md`
    appears only as docs/ARCHITECTURE.md, never with a section number of another file."""
    bad = []
    for path in sorted(ROOT.rglob("*")):
        if (
            not path.is_file()
            or path.suffix not in {".py", ".yaml", ".yml", ".md", ".tpl", ".toml"}
            or path == Path(__file__).resolve()
            or any(part in {".venv", ".git", "node_modules", "out"} for part in path.parts)
        ):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in re.finditer(r"(\S*)ARCHITECTURE\.md", line):
                if not m.group(1).endswith("docs/") or re.search(
                    r"ARCHITECTURE\.md,? (section|s\.) ?\d", line
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "cite docs/ARCHITECTURE.md by section name:\n" + "\n".join(bad)
