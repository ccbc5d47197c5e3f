"""The paged model on tiny generated checkpoints (HF layout): forward vs reference, loader errors, tokenizer."""

import json
import os
import shutil

import pytest
import torch
from model_fixtures import PagedRunner, make_tiny_checkpoint, tiny_checkpoint  # noqa: F401  (fixture)

from specops.engine.model import flashinfer_available, load_model, reference_forward
from specops.engine.model.random_checkpoint import llama3_8b_shapes_config, random_model
from specops.engine.model.llama import expected_shapes

ARCHS = {
    "llama_tied": dict(),
    "qwen2_bias_untied": dict(architecture="Qwen2ForCausalLM", tie_word_embeddings=False, num_heads=4,
                              num_kv_heads=2, hidden_size=192),
    "mistral_mha_hd32": dict(architecture="MistralForCausalLM", num_heads=4, num_kv_heads=4, head_dim=32),
}


@pytest.fixture(scope="module", params=list(ARCHS))
def tiny_model(request, tmp_path_factory):
    path = make_tiny_checkpoint(tmp_path_factory.mktemp(request.param), **ARCHS[request.param])
    return load_model(path)


def run_schedule(model, prompts, block_size, split):
    """Chunked prefill of prompt 0 across two steps, the others' prefill in step 1, then
    three all-decode steps (greedy tokens from the paged logits). Returns per-sequence
    (all token ids, paged logits for every position)."""
    runner = PagedRunner(model, len(prompts), max_len=max(map(len, prompts)) + 8, block_size=block_size)
    toks = [list(p) for p in prompts]
    logits = [[] for _ in prompts]
    first = {0: prompts[0][:split], **{i: list(p) for i, p in enumerate(prompts) if i}}
    for s, lg in runner.step(first).items():
        logits[s].append(lg)
    second = {0: prompts[0][split:]}
    for i in range(1, len(prompts)):  # the others decode while prompt 0 finishes its prefill
        nxt = int(logits[i][-1][-1].argmax())
        toks[i].append(nxt)
        second[i] = [nxt]
    for s, lg in runner.step(second).items():
        logits[s].append(lg)
    for _ in range(3):
        step = {}
        for i in range(len(prompts)):
            nxt = int(logits[i][-1][-1].argmax())
            toks[i].append(nxt)
            step[i] = [nxt]
        for s, lg in runner.step(step).items():
            logits[s].append(lg)
    return [(t, torch.cat(lg)) for t, lg in zip(toks, logits)]


@pytest.mark.parametrize("block_size", [5, 16])
def test_paged_forward_matches_reference(tiny_model, block_size):
    g = torch.Generator().manual_seed(1)
    v = tiny_model.config.vocab_size
    prompts = [torch.randint(3, v, (n,), generator=g).tolist() for n in (23, 11, 1, 16)]
    for toks, paged in run_schedule(tiny_model.model, prompts, block_size, split=9):
        ref = reference_forward(tiny_model.model, toks)
        assert paged.shape == ref.shape == (len(toks), v)
        assert paged.dtype == torch.float32
        torch.testing.assert_close(paged, ref, rtol=1e-4, atol=1e-4)


def test_model_interface(tiny_checkpoint):
    lm = load_model(tiny_checkpoint)
    c = lm.config
    assert lm.model.attn_backend_name == "torch" and lm.dtype == torch.float32
    caches = lm.model.make_kv_caches(7, 4)
    assert len(caches) == c.num_layers
    assert all(x.shape == (2, 7, 4, c.num_kv_heads, c.head_dim) and x.dtype == torch.float32 for x in caches)
    assert lm.model.compute_logits(torch.randn(3, c.hidden_size)).shape == (3, c.vocab_size)
    lm16 = load_model(tiny_checkpoint, dtype=torch.bfloat16)
    assert lm16.model.make_kv_caches(2, 4)[0].dtype == torch.bfloat16
    assert lm16.model.compute_logits(torch.randn(2, c.hidden_size, dtype=torch.bfloat16)).dtype == torch.float32


def test_tokenizer(tiny_checkpoint):
    tok = load_model(tiny_checkpoint).tokenizer
    assert tok.vocab_size == 384 and tok.eos_token_ids == [2] and tok.bos_token_id == 1
    for text in ["Hello world!", "The capital of France is Paris.", "  spaces\tand\nnewlines ", "ünïcödé ✓ 🚀",
                 "1234567890"]:
        assert tok.decode(tok.encode(text)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(chat)
    assert ids[0] == 1 and ids.count(2) == 1 and ids.count(1) == 2  # special tokens parsed as single ids
    assert tok.decode(ids) == "user\nHi\nassistant\n"
    assert tok.id_to_token(2) == "<|im_end|>"
    assert tok.decode([5, 10**6, -1]) == tok.decode([5])  # ids outside the vocabulary are dropped
    with pytest.raises(TypeError, match="text must be a str, got int"):
        tok.encode(123)
    # messages the template cannot use: a ValueError naming the message (was jinja's UndefinedError / TypeError)
    for bad, words in [([{"role": "user"}], r"messages\[0\]\['content'\] must be a string, got nothing"),
                       ([{"role": "user", "content": 5}], "got int"), ([], "non-empty list"),
                       ("hi", "non-empty list"),
                       ([{"role": "user", "content": "a"}, 7], r"messages\[1\] must be a dict")]:
        with pytest.raises(ValueError, match=words):
            tok.apply_chat_template(bad)
    tok._template = None
    tok.chat_template = "{{ messages[0]['name'].first }}"   # a key check_messages does not require
    with pytest.raises(ValueError, match="chat template could not render"):
        tok.apply_chat_template([{"role": "user", "content": "Hi"}])


def test_chat_templates_get_the_environment_they_are_written_for(tiny_checkpoint):
    """transformers' jinja2 environment: {% break %} / {% continue %} (loopcontrols) compile, and
    tojson keeps non-ASCII text and < > & as they are (Llama-3.1's tool messages go through it);
    a template that does not compile is a ValueError, not jinja2's own exception."""
    tok = load_model(tiny_checkpoint).tokenizer
    msgs = [{"role": "user", "content": "weather?"}, {"role": "tool", "content": "x < 3 & café"},
            {"role": "user", "content": "thanks"}]
    tok._template = None
    tok.chat_template = ("{% for m in messages %}{% if m.role == 'user' and loop.index > 1 %}{% break %}{% endif %}"
                         "{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.role }}: {{ m.content | tojson }} "
                         "{% endfor %}")
    assert tok.apply_chat_template(msgs) == 'user: "weather?" tool: "x < 3 & café" '
    tok._template = None
    tok.chat_template = "{{ messages | tojson(indent=2) }}"
    assert tok.apply_chat_template(msgs[:1]) == '[\n  {\n    "role": "user",\n    "content": "weather?"\n  }\n]'
    tok._template = None
    tok.chat_template = "{% for m in messages %}{{ m.content }"
    with pytest.raises(ValueError, match="chat template does not compile: TemplateSyntaxError"):
        tok.apply_chat_template(msgs)


# ---- bad checkpoints ---------------------------------------------------------------------------


def test_unknown_path():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("/nonexistent/model/dir")


def _edit_config(path, **changes):
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)


def _edit_tensors(path, fn):
    from safetensors.torch import load_file, save_file
    f = os.path.join(path, "model.safetensors")
    t = load_file(f)
    fn(t)
    save_file(t, f)


@pytest.mark.parametrize("breakage,match", [
    (lambda p: _edit_config(p, hidden_size=None), "missing required keys.*hidden_size"),
    (lambda p: _edit_config(p, architectures=["GPT2LMHeadModel"]), "not supported"),
    (lambda p: _edit_config(p, hidden_act="gelu"), "hidden_act"),
    (lambda p: _edit_config(p, num_key_value_heads=3), "multiple of"),
    (lambda p: open(os.path.join(p, "config.json"), "w").write("{not json"), "invalid JSON"),
    (lambda p: os.remove(os.path.join(p, "config.json")), "no config.json"),
    (lambda p: os.remove(os.path.join(p, "tokenizer.json")), "no tokenizer.json"),
    (lambda p: os.remove(os.path.join(p, "model.safetensors")), "no \\*.safetensors"),
    (lambda p: open(os.path.join(p, "model.safetensors"), "wb").write(b"junk"), "not a readable safetensors"),
    (lambda p: _edit_tensors(p, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
     "missing tensor 'model.layers.1.mlp.up_proj.weight'"),
    (lambda p: _edit_tensors(p, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 128)})),
     r"k_proj.weight' has shape \(32, 128\), expected \(64, 128\)"),
    (lambda p: _edit_tensors(p, lambda t: t.update({"model.extra.weight": torch.zeros(3)})), "does not use"),
    (lambda p: _edit_config(p, tie_word_embeddings=False), "missing tensor 'lm_head.weight'"),
    # integer weights were cast to the model dtype: a garbage model, no error
    (lambda p: _edit_tensors(p, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": t[
        "model.layers.0.mlp.up_proj.weight"].to(torch.int8)})), r"up_proj.weight' has dtype torch.int8"),
    # rope scaling without its numbers (a bare KeyError when the model was built) or with a factor
    # of 0 (NaN logits)
    (lambda p: _edit_config(p, rope_scaling={"rope_type": "linear"}), r"rope_scaling \(linear\) needs factor"),
    (lambda p: _edit_config(p, rope_scaling={"rope_type": "linear", "factor": 0.0}), "needs factor as a finite"),
    (lambda p: _edit_config(p, rope_scaling={"rope_type": "llama3", "factor": 8.0}), "needs low_freq_factor"),
])
def test_malformed_checkpoint(tiny_checkpoint, tmp_path, breakage, match):
    path = str(tmp_path / "broken")
    shutil.copytree(tiny_checkpoint, path)
    breakage(path)
    with pytest.raises(ValueError, match=match):
        load_model(path)


def test_bad_arguments(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        load_model(tiny_checkpoint, dtype=torch.int32)
    with pytest.raises(TypeError, match="path"):
        load_model(123)
    with pytest.raises(ValueError, match="attn_backend"):
        load_model(tiny_checkpoint, attn_backend="nope")
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"not a model")
    with pytest.raises(ValueError, match="neither a directory nor a .gguf"):
        load_model(str(junk))
    fake_gguf = tmp_path / "model.gguf"
    fake_gguf.write_bytes(b"GGUF but truncated")
    with pytest.raises(ValueError, match="GGUF"):
        load_model(str(fake_gguf))


def test_llama3_8b_shapes_config():
    c = llama3_8b_shapes_config(num_layers=2)
    shapes = expected_shapes(c)
    assert shapes["layers.0.qkv_proj.weight"] == ((32 + 2 * 8) * 128, 4096)
    assert shapes["layers.1.gate_up_proj.weight"] == (2 * 14336, 4096)
    assert shapes["lm_head.weight"] == (128256, 4096)
    per_layer = sum(int(torch.tensor(s).prod()) for k, s in shapes.items() if k.startswith("layers.0."))
    assert per_layer == 218_112_000  # Llama-3-8B: 4096*(4096+1024+1024+4096) + 3*4096*14336 + 2*4096


def test_hf_dir_reads_the_indexed_shards_only(tiny_checkpoint, tmp_path):  # noqa: F811
    """Mistral repos ship consolidated.safetensors (other names) beside the HF shards: it was read
    too, and loading failed on its unknown tensors. The index's shards are read; a consolidated
    file beside unindexed shards is skipped; a tensor in two files is an error."""
    from safetensors.torch import load_file, save_file

    want = load_model(tiny_checkpoint).model.state_dict()
    tensors = load_file(os.path.join(tiny_checkpoint, "model.safetensors"))
    names = sorted(tensors)
    d = tmp_path / "sharded"
    shutil.copytree(tiny_checkpoint, d)
    os.remove(d / "model.safetensors")
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(d / shard))
    save_file({"layers.0.attention.wq.weight": torch.zeros(4, 4)}, str(d / "consolidated.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    got = load_model(str(d)).model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    os.remove(d / "model.safetensors.index.json")            # no index: the consolidated file is skipped
    got = load_model(str(d)).model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    save_file({names[0]: tensors[names[0]]}, str(d / "model-extra.safetensors"))
    with pytest.raises(ValueError, match="are in another file"):
        load_model(str(d))


def test_llama_with_attention_bias_has_an_o_proj_bias(tmp_path):
    """HF's LlamaAttention with attention_bias=true gives q, k, v and o one bias each; the o
    bias was not taken (loading failed on it). Paged forward = reference; = transformers'
    logits where it is installed."""
    import dataclasses

    from specops.engine.model.random_checkpoint import tiny_config, write_random_checkpoint

    config = dataclasses.replace(tiny_config(tie_word_embeddings=False), attention_bias=True, o_proj_bias=True)
    path = write_random_checkpoint(str(tmp_path / "llama_bias"), config)
    assert json.load(open(os.path.join(path, "config.json")))["attention_bias"] is True
    lm = load_model(path)
    assert lm.config.o_proj_bias and lm.model.layers[0].o_proj.bias is not None
    [(toks, paged)] = run_schedule(lm.model, [list(range(3, 40))], 8, split=9)
    ref = reference_forward(lm.model, toks)
    torch.testing.assert_close(paged, ref, rtol=1e-4, atol=1e-4)
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    with torch.no_grad():
        theirs = hf(torch.tensor([toks])).logits[0]
    torch.testing.assert_close(ref, theirs, rtol=1e-4, atol=1e-4)


LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}


def test_config_reads_rope_parameters_of_transformers_5():
    """transformers >= 5 writes rope_theta and the scaling inside rope_parameters: they were
    dropped (theta 10000, no scaling: wrong positions, silently), and must equal the 4.x layout."""
    from specops.engine.model.config import ModelConfig

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                architectures=["LlamaForCausalLM"])
    v4 = ModelConfig.from_hf_dict({**base, "rope_theta": 500000.0, "rope_scaling": LLAMA31_ROPE})
    v5 = ModelConfig.from_hf_dict({**base, "rope_parameters": {**LLAMA31_ROPE, "rope_theta": 500000.0}})
    assert v5 == v4 and v5.rope_theta == 500000.0 and v5.rope_scaling["factor"] == 8.0
    plain = ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}})
    assert plain.rope_theta == 1e5 and plain.rope_scaling is None
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e5}})
    with pytest.raises(ValueError, match="rope_parameters .* is not supported"):  # one per layer type
        ModelConfig.from_hf_dict({**base, "rope_parameters": {"full_attention": {"rope_type": "default"}}})


def test_gguf_config_reads_rope_scaling():
    """GGUF's rope.scaling.type / .factor (and the older rope.scale_linear) were ignored: linear
    scaling is kept, 'none' is no scaling, any other type is refused rather than dropped."""
    from specops.engine.model.gguf_loader import config_from_fields

    fields = {"general.architecture": "llama", "llama.embedding_length": 64, "llama.attention.head_count": 4,
              "llama.feed_forward_length": 128, "llama.block_count": 1, "llama.context_length": 4096,
              "tokenizer.ggml.tokens": ["a"] * 100}
    assert config_from_fields(fields)[0].rope_scaling is None
    linear = {"rope_type": "linear", "factor": 4.0}
    assert config_from_fields({**fields, "llama.rope.scaling.type": "linear",
                               "llama.rope.scaling.factor": 4.0})[0].rope_scaling == linear
    assert config_from_fields({**fields, "llama.rope.scale_linear": 4.0})[0].rope_scaling == linear
    assert config_from_fields({**fields, "llama.rope.scaling.type": "none"})[0].rope_scaling is None
    with pytest.raises(ValueError, match="GGUF rope scaling type 'yarn'"):
        config_from_fields({**fields, "llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0})
    for bad in (0.0, -2.0, float("inf")):      # a factor of 0 loaded and gave NaN logits
        with pytest.raises(ValueError, match="GGUF rope scaling factor must be a finite number > 0"):
            config_from_fields({**fields, "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": bad})


# ---- CUDA ----------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_flashinfer = pytest.mark.skipif(not flashinfer_available(), reason="needs CUDA and flashinfer")


@needs_cuda
def test_cuda_fp32_torch_backend_matches_reference(tiny_checkpoint):
    lm = load_model(tiny_checkpoint, device="cuda", dtype=torch.float32, attn_backend="torch")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n in (20, 7, 13)]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here, whatever others set
    try:
        for toks, paged in run_schedule(lm.model, prompts, 16, split=8):
            ref = reference_forward(lm.model, toks)
            torch.testing.assert_close(paged, ref, rtol=1e-3, atol=2e-3)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


@needs_flashinfer
def test_cuda_bf16_flashinfer_matches_torch_backend(tiny_checkpoint):
    lm = load_model(tiny_checkpoint, device="cuda")  # bf16, FlashInfer by default
    assert lm.dtype == torch.bfloat16 and lm.model.attn_backend_name == "flashinfer"
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 384, (n,), generator=g).tolist() for n in (40, 9, 17, 1)]
    fi = run_schedule(lm.model, prompts, 16, split=25)
    agree = total = 0
    for toks, a in fi:
        ref = reference_forward(lm.model, toks)  # bf16 too, plain causal SDPA
        assert (a - ref).abs().max() < 0.05 * ref.abs().max() + 0.1
        agree += int((a.argmax(-1) == ref.argmax(-1)).sum())
        total += a.shape[0]
    assert agree >= 0.9 * total


@needs_flashinfer
def test_cuda_llama3_8b_shapes_flashinfer_vs_torch():
    lm = random_model(llama3_8b_shapes_config(num_layers=2), device="cuda")
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 128256, (n,), generator=g).tolist() for n in (70, 33, 5)]
    assert lm.model.attn_backend_name == "flashinfer"
    fi = run_schedule(lm.model, prompts, 16, split=40)
    lm.model.set_attn_backend("torch")
    paged_torch = run_schedule(lm.model, prompts, 16, split=40)
    for (toks, a), (toks_t, b) in zip(fi, paged_torch):
        ref = reference_forward(lm.model, toks)
        rel = (a - ref).norm() / ref.norm()
        assert rel < 0.05, f"flashinfer: relative logits error {rel:.3g}"
        if toks_t == toks:  # same greedy path: the torch backend agrees too
            assert (b - ref).norm() / ref.norm() < 0.05
