"""Reasoning gate: unconstrained until the end-of-reasoning marker, constrained after it,
including a marker split across steps or falling inside a draft window."""

import json
import random

import pytest
import torch

from specops.engine.structured_output import ReasoningConfig, ReasoningGate
from specops.engine.structured_output.testing import allowed_tokens

MARK = (7, 8, 9)


def _ref_after(tokens, marker=MARK):
    """Reference: the tokens after the first complete occurrence of the marker, or None."""
    m = len(marker)
    for i in range(m, len(tokens) + 1):
        if tuple(tokens[i - m: i]) == marker:
            return list(tokens[i:])
    return None


def test_split_across_steps():
    g = ReasoningGate(ReasoningConfig(MARK))
    assert g.split([1, 2, 7]) == [] and not g.ended
    assert g.split([8]) == [] and not g.ended
    assert g.split([9, 4, 5]) == [4, 5] and g.ended
    assert g.split([7, 8, 9, 6]) == [7, 8, 9, 6]  # after the end, everything is constrained output
    g = ReasoningGate(ReasoningConfig(MARK))
    assert g.split([7, 8, 7, 8, 9]) == [] and g.ended  # overlapping false start
    g = ReasoningGate(ReasoningConfig((5,)))
    assert g.split([1, 5, 5, 2]) == [5, 2]


def test_first_constrained_in_draft_window():
    g = ReasoningGate(ReasoningConfig(MARK))
    assert g.split([3, 7, 8]) == []
    # history ends with 7, 8: the window's first draft completes the marker, so row 1 on is constrained
    assert g.first_constrained([9, 1, 2, 3]) == 1
    assert g.first_constrained([1, 2, 3, 4]) == 5  # no row constrained
    assert g.first_constrained([]) == 1
    assert g.first_constrained([1, 7, 8, 9]) == 4  # only the bonus row
    assert not g.ended  # looking does not move
    g.split([9])
    assert g.first_constrained([1, 2]) == 0


def test_gate_matches_reference_on_random_streams():
    rng = random.Random(0)
    for _ in range(400):
        stream = [rng.choice([7, 8, 9, 1]) for _ in range(rng.randrange(0, 14))]
        g = ReasoningGate(ReasoningConfig(MARK))
        fed, got = [], []
        pos = 0
        while pos < len(stream):
            k = rng.randrange(1, 5)
            drafts = stream[pos: pos + k]
            # before emitting, the window's first constrained row must match the reference
            first = g.first_constrained(drafts)
            expect = next((j for j in range(len(drafts) + 1) if _ref_after(fed + drafts[:j]) is not None),
                          len(drafts) + 1)
            assert first == expect, (fed, drafts)
            chunk = stream[pos: pos + rng.randrange(1, 4)]
            got += g.split(chunk)
            fed += chunk
            pos += len(chunk)
        ref = _ref_after(fed)
        assert got == (ref or []) and g.ended == (ref is not None), fed


def test_prompt_with_closed_reasoning_block():
    cfg = ReasoningConfig(end_marker=(9,), start_marker=(6,))
    assert ReasoningGate(cfg, [1, 6, 2, 9, 3]).ended  # template closed an empty block: constrain at once
    assert not ReasoningGate(cfg, [1, 6, 2, 9, 3, 6]).ended  # a new block was opened
    assert not ReasoningGate(cfg, [1, 2]).ended
    assert not ReasoningGate(ReasoningConfig((9,)), [9]).ended  # no start marker: the prompt is not read


def test_variants_of_the_end_marker_end_it_too():
    # the marker's text cut into other pieces (" </" "think" ">" beside "</" "think" ">"): a
    # variant completes the marker as the marker does, across steps and in a draft window
    cfg = ReasoningConfig(MARK, end_variants=((6, 8, 9), (5, 4, 8, 9), MARK))
    assert cfg.end_variants == ((6, 8, 9), (5, 4, 8, 9))   # the marker itself is no variant
    g = ReasoningGate(cfg)
    assert g.split([1, 5, 4]) == [] and g.split([8]) == [] and not g.ended
    assert g.first_constrained([9, 2, 3]) == 1
    assert g.split([9, 2, 3]) == [2, 3] and g.ended
    g = ReasoningGate(cfg)
    assert g.split([6, 8, 9, 7]) == [7]
    assert ReasoningGate(ReasoningConfig((9,), start_marker=(1,), end_variants=((3, 4),)), [1, 2, 3, 4, 5]).ended
    assert not ReasoningGate(ReasoningConfig((9,), start_marker=(1,), end_variants=((3, 4),)), [3, 4, 1, 2]).ended
    rng = random.Random(1)
    for _ in range(300):   # against the reference: the first of the marker's or a variant's completions
        stream = [rng.choice([5, 4, 6, 7, 8, 9, 1]) for _ in range(rng.randrange(0, 14))]
        g = ReasoningGate(cfg)
        got, pos = [], 0
        while pos < len(stream):
            chunk = stream[pos: pos + rng.randrange(1, 4)]
            got += g.split(chunk)
            pos += len(chunk)
        ends = [len(stream) - len(a) for m in cfg.end_markers if (a := _ref_after(stream, m)) is not None]
        assert got == (stream[min(ends):] if ends else []) and g.ended == bool(ends), stream


def test_from_text_finds_the_marker_written_after_a_space():
    # SmolLM2 cuts "</think>" into "</" "think" ">" alone, but " </think>" into " </" "think" ">":
    # the marker after a space was missed, and the answer stayed unconstrained
    from specops.engine.structured_output.testing import default_tokenizer
    try:
        tok = default_tokenizer()
    except FileNotFoundError:
        pytest.skip("the default model package is not installed")
    cfg = ReasoningConfig.from_text(tok)
    for text in ("I see </think>", "Done.</think>", "ok\n</think>", "</think>"):
        g = ReasoningGate(cfg)
        assert g.split(tok.encode(text, add_special_tokens=False)) == [] and g.ended, text
    g = ReasoningGate(cfg)
    assert g.split(tok.encode("I think so, <think> is not </thin", add_special_tokens=False)) == [] and not g.ended


def test_config_checks():
    with pytest.raises(ValueError, match="end_marker must be a non-empty"):
        ReasoningConfig(())
    with pytest.raises(ValueError, match="start_marker"):
        ReasoningConfig((1,), start_marker=("x",))


@pytest.fixture(scope="module")
def so_parts():
    pytest.importorskip("xgrammar")
    from specops.engine.structured_output import StructuredOutputManager, StructuredOutputOptions
    from specops.engine.structured_output.testing import small_tokenizer

    tok = small_tokenizer()
    marker = tuple(tok.encode("END"))
    assert len(marker) == 3
    so = StructuredOutputManager(tok, reasoning=ReasoningConfig(marker), compile_timeout_s=20)
    yield tok, so, marker, StructuredOutputOptions
    so.shutdown()


def _fresh_row(so, options, tokens):
    """Reference row: a fresh matcher advanced through ``tokens``."""
    from specops.engine.structured_output import GrammarState

    state = GrammarState(so.backend.new_matcher(so.backend.compile(options)))
    assert state.accept_tokens(tokens)
    bm = torch.zeros((1, so.backend.bitmask_width), dtype=torch.int32)
    state.fill_bitmask(bm, 0)
    return bm[0]


def test_manager_marker_inside_draft_window(so_parts):
    tok, so, marker, Options = so_parts
    opts = Options(json_schema={"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                          "maximum": 99}}, "required": ["a"]})
    so.add_request("r", opts)
    assert so.wait("r", 10).value == "ready"
    # reasoning text that is not JSON at all is accepted as is
    thinking = tok.encode("hmm, {not json] ")
    assert so.accept_tokens("r", thinking)
    body = tok.encode('{"a": 42}')
    drafts = [tok.encode("x")[0]] + list(marker) + body[:3]
    # drafts before and including the marker pass; after it the grammatical prefix and the first
    # forbidden draft (verified, so rejected by its masked row), not what follows it
    bad = tok.encode("]")[0]
    assert so.validate_drafts("r", drafts) == drafts
    assert so.validate_drafts("r", drafts[:4] + [bad] + body[:2]) == drafts[:4] + [bad]
    batch = so.build_bitmask([(None, 2, [5]), ("r", len(drafts) + 1, drafts), (None, 1, [])])
    rows = list(range(2, 2 + len(drafts) + 1))
    first = 1 + len(marker)  # row of the token after the marker
    assert batch.indices == rows[first:]
    for j in range(first, len(drafts) + 1):
        assert torch.equal(batch.bitmask[rows[j]], _fresh_row(so, opts, drafts[first:j])), j
    # the step emits two reasoning tokens, the marker and the JSON start: only the latter reach the grammar
    emitted = drafts[:first] + body[:2]
    assert so.accept_tokens("r", emitted)
    assert so._entries["r"].grammar.num_accepted == 2
    assert so.accept_tokens("r", body[2:] + tok.eos_token_ids)
    assert so.is_terminated("r")
    text = tok.decode(body)
    assert json.loads(text) == {"a": 42}
    so.remove_request("r")


def test_manager_marker_in_previous_step_then_window(so_parts):
    tok, so, marker, Options = so_parts
    opts = Options(choice=["yes", "no"])
    so.add_request("c", opts)
    assert so.wait("c", 10).value == "ready"
    assert so.accept_tokens("c", tok.encode("think think") + list(marker[:2]))
    yes = tok.encode("yes")
    drafts = [marker[2]] + yes
    batch = so.build_bitmask([("c", len(drafts) + 1, drafts)])
    assert batch.indices == list(range(1, len(drafts) + 1))
    first_row = set(allowed_tokens(batch.bitmask[1], so.vocab_size).tolist())
    assert first_row == {tok.encode("y")[0], tok.encode("n")[0]}
    assert set(allowed_tokens(batch.bitmask[2], so.vocab_size).tolist()) == {tok.encode("e")[0]}
    so.remove_request("c")
