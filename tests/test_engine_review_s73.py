"""Review session 73: defects found by using the README's promises as a new user would
(model directories with broken side files, the KV budget's error, prompts as numpy / torch rows)."""

import json
import shutil

import numpy as np
import pytest
import torch
from model_fixtures import tiny_checkpoint  # noqa: F401  (fixture)

from specops.cli import main
from specops.engine.llm import LLM
from specops.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY = SamplingParams(temperature=0, max_tokens=3)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


@pytest.mark.parametrize("name, content, expected", [
    ("tokenizer.json", "garbage", "tokenizer.json: not a readable tokenizer file"),
    ("tokenizer_config.json", "{", "tokenizer_config.json: invalid JSON"),
    ("tokenizer_config.json", "[1]", "tokenizer_config.json: expected a JSON object, got list"),
    ("generation_config.json", "nope", "generation_config.json: invalid JSON"),
    ("config.json", b"\xff\xfe{}", "config.json: invalid JSON"),
    ("tokenizer_config.json", '{"chat_template": ["abc"]}', "tokenizer_config.json: chat_template must be"),
    ("tokenizer_config.json", '{"chat_template": 5}', "tokenizer_config.json: chat_template must be a string"),
    ("tokenizer_config.json", '{"eos_token": 5}', "tokenizer_config.json: eos_token must be a string"),
])
def test_a_broken_model_side_file_is_a_clear_error_naming_it(tiny_checkpoint, tmp_path, capsys,  # noqa: F811
                                                            name, content, expected):
    """A model directory with a corrupt tokenizer.json raised the tokenizers library's bare
    Exception (a traceback from the CLI), a tokenizer_config.json that is a JSON list, or whose
    chat_template is a list of strings, an AttributeError (a traceback), an int eos_token a
    TypeError naming no file, an int chat_template jinja's "Can't compile non template nodes"
    (at --chat), and invalid JSON in the side files a message naming no file."""
    model = _copy(tiny_checkpoint, tmp_path / "m")
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(f"{model}/{name}", mode) as f:
        f.write(content)
    assert main(["generate", "hi", "--model", model, "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err


def test_a_kv_budget_below_one_block_names_kv_cache_memory(tiny_checkpoint, capsys):  # noqa: F811
    """--kv-cache-memory 100 was reported as `error: --block-size: block_size=16: ...`, an
    option the user never gave."""
    assert main(["generate", "hi", "--model", tiny_checkpoint, "--kv-cache-memory", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --kv-cache-memory: kv_cache_memory=100"), err
    assert "--block-size" not in err


def test_prompts_as_numpy_or_torch_rows_in_a_list(tiny_checkpoint):  # noqa: F811
    """One 1-D array is a prompt and a 2-D array a batch, but a list of 1-D arrays (the only
    way to give prompts of different lengths) failed every request with 'got ndarray'."""
    llm = LLM(tiny_checkpoint, max_model_len=64)
    want = [o.outputs[0].token_ids for o in llm.generate([[5, 6, 7], [8, 9]], GREEDY)]
    for rows in ([np.array([5, 6, 7]), np.array([8, 9])], [torch.tensor([5, 6, 7]), torch.tensor([8, 9])]):
        outs = llm.generate(rows, GREEDY)
        assert [o.error for o in outs] == [None, None]
        assert [o.outputs[0].token_ids for o in outs] == want
    bad = llm.generate([torch.tensor([1.0, 2.0])], GREEDY)[0]   # float ids still fail alone, by name
    assert "prompt token ids must be ints" in bad.error


@pytest.mark.parametrize("prompts", [5, None])
def test_a_prompt_that_is_no_prompt_says_what_a_prompt_is(tiny_checkpoint, prompts):  # noqa: F811
    """llm.generate(5) raised "'int' object is not iterable"."""
    llm = LLM(tiny_checkpoint, max_model_len=64)
    with pytest.raises(TypeError, match="prompts must be a prompt"):
        llm.generate(prompts, GREEDY)


class _FullDisk:
    """A stdout on a full disk (as `> /dev/full`): every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(28, "No space left on device")

    def flush(self):
        pass


def test_single_prompt_to_a_full_disk_is_an_error_not_a_traceback(tiny_checkpoint, monkeypatch, capsys):  # noqa: F811
    """`specops generate hi > /dev/full` printed an OSError traceback (batch mode already said
    `error: [Errno 28] No space left on device` and exited 2)."""
    monkeypatch.setattr("sys.stdout", _FullDisk())
    code = main(["generate", "hi", "--model", tiny_checkpoint, "--max-tokens", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err, err


def test_a_prompt_that_fills_the_context_says_what_sets_the_context(tiny_checkpoint):  # noqa: F811
    """The error said `max_model_len=64` when the KV cache (num_kv_blocks=4), not a
    max_model_len the user never gave, set the context's length."""
    llm = LLM(tiny_checkpoint, num_kv_blocks=4, block_size=16)
    out = llm.generate([list(range(5, 75))], GREEDY)[0]
    assert "the context holds 64 (what the KV cache holds: 4 blocks of 16 tokens, sized by num_kv_blocks)" in out.error, out.error
    llm = LLM(tiny_checkpoint, max_model_len=32)
    out = llm.generate([list(range(5, 45))], GREEDY)[0]
    assert "prompt has 40 tokens but the context holds 32 (max_model_len)" in out.error, out.error
    llm = LLM(tiny_checkpoint, kv_cache_memory=3 * _block_bytes(llm),
              max_num_seqs=1, block_size=16)
    out = llm.generate([list(range(5, 75))], GREEDY)[0]
    assert "the context holds 48 (what the KV cache holds: 3 blocks of 16 tokens, sized by kv_cache_memory)" \
        in out.error, out.error


def _block_bytes(llm) -> int:
    """Bytes of one KV block of 16 tokens of `llm`'s model in its dtype."""
    mc = llm.engine.model_config
    return mc.num_layers * 2 * 16 * mc.num_kv_heads * mc.head_dim * 4


def test_a_batch_line_with_n_samples_gives_each_samples_tokens_and_finish_reason(tiny_checkpoint, tmp_path):  # noqa: F811
    """With n > 1 a batch output line held only sample 0's token_ids and finish_reason (and every
    sample's text under "texts"): "samples" now holds each one's text, tokens and finish reason."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"prompt": "hello", "n": 3, "temperature": 1.0, "seed": 4, "max_tokens": 5}) + "\n")
    assert main(["generate", "--model", tiny_checkpoint, "--prompts-file", str(src), "--output", str(dst),
                 "--device", "cpu"]) == 0
    row = json.loads(dst.read_text())
    llm = LLM(tiny_checkpoint, device="cpu")
    want = llm.generate(["hello"], SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=5))[0].outputs
    assert [s["token_ids"] for s in row["samples"]] == [c.token_ids for c in want]
    assert [s["text"] for s in row["samples"]] == row["texts"] == [c.text for c in want]
    assert [s["finish_reason"] for s in row["samples"]] == [c.finish_reason for c in want]
    assert row["token_ids"] == want[0].token_ids and len({tuple(c.token_ids) for c in want}) > 1


def test_a_repeated_logit_bias_merges():
    """A second --logit-bias replaced the first, dropping its tokens unsaid (the list options
    append); the objects now merge, a later key winning."""
    from specops.cli import build_parser
    args = build_parser().parse_args(["generate", "hi", "--logit-bias", '{"5": 1, "7": 4}', "--logit-bias",
                                      '{"6": 2, "5": 3}'])
    assert args.sp_logit_bias == {5: 3, 6: 2, 7: 4}
    assert build_parser().parse_args(["generate", "hi"]).sp_logit_bias is None


def test_prompts_file_from_standard_input_and_with_a_byte_order_mark(tiny_checkpoint, tmp_path):  # noqa: F811
    """`--prompts-file -` was taken as a file named "-", and a file an editor had begun with a
    UTF-8 byte-order mark was refused as not JSON at line 1."""
    import subprocess
    import sys
    lines = json.dumps({"id": "a", "prompt": "hello"}) + "\n" + json.dumps("world") + "\n"
    base = [sys.executable, "-m", "specops.cli", "generate", "--model", tiny_checkpoint, "--device", "cpu",
            "--max-tokens", "3"]
    r = subprocess.run(base + ["--prompts-file", "-"], input=lines.encode(), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    rows = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert [x["id"] for x in rows] == ["a", 1] and all(x["error"] is None for x in rows)
    src = tmp_path / "bom.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + lines.encode())
    r2 = subprocess.run(base + ["--prompts-file", str(src)], capture_output=True)
    assert r2.returncode == 0 and r2.stdout == r.stdout, r2.stderr.decode()


def test_prompts_file_from_a_closed_standard_input_is_an_error():
    """`--prompts-file -` with standard input closed (`<&-`) raised AttributeError (a traceback)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "specops.cli", "generate", "--prompts-file", "-", "--model",
                        "/nonexistent"], stdin=None, capture_output=True, text=True,
                       preexec_fn=lambda: __import__("os").close(0))
    assert r.returncode == 2 and r.stderr.strip() == "error: --prompts-file -: standard input is closed", r.stderr
