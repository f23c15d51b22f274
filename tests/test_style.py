"""The exported code reads as the house rules ask: lines of at most 120 characters and one statement per line.

nbdev writes `__all__` itself (wrapped at 120 before its `__all__ = ` prefix), so its lines are not counted."""
import io, tokenize
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parents[1] / "veloxquant_mlx"
MODULES = sorted(p for p in PKG.rglob("*.py") if p.name != "_modidx.py")   # the `eval` harness too
PENDING = set()  # every module clean
MODULES = [pytest.param(p, marks=pytest.mark.xfail(reason="restructure in progress")) if p.name in PENDING else p
           for p in MODULES]

def offending(path:Path)->list:
    "(line number, reason, line) of every line over 120 characters and every semicolon-joined statement."
    src = path.read_text()
    lines, out, in_all = src.splitlines(), [], False
    for i, line in enumerate(lines, 1):
        in_all = line.startswith("__all__ = [") or (in_all and line.startswith(" ") and not lines[i - 2].endswith("]"))
        if len(line) > 120 and not in_all: out.append((i, "long", line))
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.OP and tok.string == ";": out.append((tok.start[0], "semicolon", lines[tok.start[0] - 1]))
    return out

@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)) if isinstance(p, Path) else None)
def test_exported_code_style(path):
    bad = offending(path)
    assert not bad, "\n".join(f"{path.name}:{i}: {why}: {line[:100]}" for i, why, line in bad)

def test_the_checker_finds_both(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("a = 1; b = 2\n" + "x = '" + "y" * 130 + "'\n" + "__all__ = ['" + "z" * 130 + "']\n")
    assert [why for _, why, _ in offending(p)] == ["long", "semicolon"]
