"""Every ```python block of the README runs as written, and prints what its comments promise.

Each block runs in a fresh namespace, in its own process (the engine examples load the default
model, SmolLM2-135M-Instruct, on the CPU), so that an example which stopped matching the API
fails here instead of in a user's hands."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[tuple[str, str]]:
    """(heading above the block, code) of each ```python block of the README."""
    text = README.read_text()
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        heading = re.findall(r"^#+ (.+)$", text[:match.start()], flags=re.M)
        blocks.append((heading[-1] if heading else "top", match.group(1)))
    return blocks


BLOCKS = python_blocks()


def needs_default_model(code: str) -> bool:
    return "LLM(" in code


def run_block(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=README.parent)


def test_the_readme_has_its_examples():
    headings = [h for h, _ in BLOCKS]
    assert len(BLOCKS) >= 4, headings
    for wanted in ("Using the ops", "Rejection sampling (speculative decoding)", "Using the engine"):
        assert wanted in headings, headings


@pytest.mark.parametrize("heading,code", BLOCKS, ids=[h for h, _ in BLOCKS])
def test_readme_example_runs(heading, code):
    if needs_default_model(code):
        from specops.engine.model.loader import default_model_path
        try:
            default_model_path()
        except FileNotFoundError as exc:  # pragma: no cover
            pytest.skip(str(exc))
    r = run_block(code)
    assert r.returncode == 0, f"{heading}:\n{r.stderr[-3000:]}"
    lines = r.stdout.strip().splitlines()
    assert lines, f"{heading}: printed nothing"
    if heading == "Using the ops":
        # print(out.sampled_token_ids): [3] int64, row 0 greedy with tokens 0-31 masked
        assert re.fullmatch(r"tensor\(\[\s*\d+,\s*\d+,\s*\d+\]\)", lines[-1]), lines
        assert int(re.findall(r"\d+", lines[-1])[0]) >= 32, lines
    elif heading == "Rejection sampling (speculative decoding)":
        # parse_output: a list per request; request 0 emits 1 to 4 tokens, request 1 exactly 1
        emitted = eval(lines[-1], {})   # a printed list of lists of ints
        assert len(emitted) == 2 and 1 <= len(emitted[0]) <= 4 and len(emitted[1]) == 1, emitted
    elif heading == "Using the engine":
        assert "Paris" in r.stdout, r.stdout
