"""The README's code blocks, for the tests that run them."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(after: str) -> str:
    """The first ```python block of the README after the line starting with ``after``."""
    text = README.read_text()
    start = text.index("```python\n", text.index(f"\n{after}")) + len("```python\n")
    return text[start : text.index("```", start)]
