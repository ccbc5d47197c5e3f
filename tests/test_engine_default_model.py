"""The engine on the default model (SmolLM2-135M-Instruct Q4_1 GGUF): the quickstart answer, greedy
tokens equal to the reference forward's, scheduling invariance, stop strings and streaming text."""

import pytest
import torch

from specops.engine.config import EngineConfig
from specops.engine.detokenizer import IncrementalDetokenizer
from specops.engine.llm import LLM
from specops.engine.llm_engine import LLMEngine
from specops.engine.model.loader import default_model_path, load_model
from specops.engine.model.reference import reference_forward
from specops.engine.sampling_params import SamplingParams

try:
    default_model_path()
except FileNotFoundError as exc:  # pragma: no cover - the install script installs it
    pytest.skip(str(exc), allow_module_level=True)

_LOADED = {}


def default_model(device, dtype=None):
    key = (device, dtype)
    if key not in _LOADED:
        _LOADED[key] = load_model(None, device=device, dtype=dtype)
    return _LOADED[key]


def chat(lm, text):
    return lm.tokenizer.encode(lm.tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def generate(lm, prompts, sp, **cfg):
    cfg.setdefault("max_model_len", 512)
    eng = LLMEngine(EngineConfig(**cfg), loaded=lm)
    llm = LLM.from_engine(eng)
    outs = llm.generate(prompts, sp)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return outs, eng


def test_quickstart_answer_matches_reference(device):
    lm = default_model(device)
    prompt = chat(lm, "What is the capital of France?")
    out = generate(lm, [prompt], SamplingParams(temperature=0.0, max_tokens=16))[0][0]
    assert "Paris" in out.text, out.text
    assert out.outputs[0].finish_reason == "stop" and out.token_ids[-1] in lm.tokenizer.eos_token_ids
    seq = prompt + out.token_ids
    logits = reference_forward(lm.model, seq[:-1])[len(prompt) - 1:]
    toks = torch.tensor(out.token_ids, device=logits.device)
    if lm.model.dtype == torch.float32 and logits.device.type == "cpu":
        assert torch.equal(logits.argmax(-1), toks)
    else:  # bf16 on CUDA (FlashInfer): near-ties may flip, the answer may not
        chosen = logits.gather(1, toks[:, None]).squeeze(1)
        assert bool((chosen >= logits.max(-1).values - 0.5).all())


def test_scheduling_does_not_change_outputs(device):
    lm = default_model(device, torch.float32)
    prompts = [chat(lm, "What is the capital of France?"), chat(lm, "Name three colours."),
               lm.tokenizer.encode("Once upon a time, in a small village,"),
               chat(lm, "What is the capital of Italy?")]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    base, _ = generate(lm, prompts, sp)
    # Small budget (chunked prefill), small pool (preemption), small blocks (prefix hits on the chat header).
    outs, eng = generate(lm, prompts, sp, max_num_batched_tokens=24, num_kv_blocks=12, block_size=8, max_model_len=96)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert eng.scheduler.num_preemptions > 0 and eng.block_manager.num_prefix_hits > 0


def test_stop_strings_and_streamed_text():
    lm = default_model("cpu")
    prompt = chat(lm, "What is the capital of France?")
    sp = dict(temperature=0.0, max_tokens=16)
    full = generate(lm, [prompt], SamplingParams(**sp))[0][0].text
    assert "Paris" in full
    eng = LLMEngine(EngineConfig(max_model_len=512), loaded=lm)
    llm = LLM.from_engine(eng)
    outs = list(llm.stream(prompt, SamplingParams(**sp, stop=["Paris", "nowhere to be seen"])))
    last = outs[-1].outputs[0]
    assert last.text == full[:full.index("Paris")] and last.finish_reason == "stop" and last.stop_reason == "Paris"
    assert "".join(o.outputs[0].delta_text for o in outs) == last.text
    # Text held back for a possible stop string is never streamed early: no delta contains "Par".
    assert all("Par" not in o.outputs[0].delta_text for o in outs)
    inc = llm.generate(prompt, SamplingParams(**sp, stop=["Paris"], include_stop_str_in_output=True))[0]
    assert inc.text == last.text + "Paris"
    streamed = "".join(o.outputs[0].delta_text for o in llm.stream(prompt, SamplingParams(**sp)))
    assert streamed == full


def test_incremental_detokenizer_unicode():
    tok = default_model("cpu").tokenizer
    text = "Grüße aus Köln! 東京タワー 🎉🎉 naïve café — done.\nNew line, 12345 digits."
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, tok.encode("Say:"), skip_special_tokens=True)
    pieces = []
    for t in ids:
        detok.update([t])
        pieces.append(detok.take_delta(finished=False))
    detok.flush()
    pieces.append(detok.take_delta(finished=True))
    assert "".join(pieces) == text == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    # Stop strings: the earliest one wins, text is cut before it.
    detok = IncrementalDetokenizer(tok, [], stop=["Köln", "aus"])
    hit = None
    for t in ids:
        hit = hit or detok.update([t])
    assert hit == "aus" and detok.text == "Grüße "


def test_detokenizer_checks_stop_strings_in_the_flushed_tail_and_holds_nothing_when_kept():
    tok = default_model("cpu").tokenizer
    # token 459 is ' ' + half a character: its space waits for the character to complete, and
    # came out only at the end, in flush(), which did not look for stop strings in it
    assert tok.decode([459]).endswith("\ufffd")
    detok = IncrementalDetokenizer(tok, [], stop=[" "])
    assert detok.update([459]) is None and detok.text == ""
    assert detok.flush() == " " and detok.text == ""
    # with include_stop_str_in_output nothing is held back: text already out is never cut
    ids = tok.encode("Grüße aus Köln")
    for include, first_delta in ((True, tok.decode(ids[:1])), (False, "")):
        detok = IncrementalDetokenizer(tok, [], stop=["zzzzzzzz"], include_stop_str_in_output=include)
        detok.update(ids[:1])
        assert detok.take_delta(finished=False) == first_delta
