"""`specops generate`: options for every SamplingParams field, streaming, batch files, clear errors."""

import json
import os
import subprocess
import sys

import pytest
import torch
from model_fixtures import tiny_checkpoint  # noqa: F401  (fixture)

from specops.cli import _sampling_params, build_parser, main
from specops.engine.sampling_params import SamplingParams


def run_cli(*args, timeout=300):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", "specops.cli", "generate", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_every_sampling_field_has_an_option():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["generate"]
    options = {s for a in sub._actions for s in a.option_strings}
    for name in SamplingParams.field_names():
        assert "--" + name.replace("_", "-") in options, name


def test_options_reach_sampling_params():
    args = build_parser().parse_args([
        "generate", "hi", "--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.05",
        "--repetition-penalty", "1.1", "--frequency-penalty", "0.2", "--presence-penalty", "0.3",
        "--logit-bias", '{"3": -1.5}', "--allowed-token-ids", "3,4", "--allowed-token-ids", "5", "--bad-words", "foo",
        "--min-tokens", "2", "--max-tokens", "9", "--stop", "a", "--stop", "b", "--stop-token-ids", "7",
        "--ignore-eos", "--seed", "11", "--logprobs", "2", "--n", "2", "--no-skip-special-tokens"])
    sp = _sampling_params(args)
    assert sp == SamplingParams(n=2, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                frequency_penalty=0.2, presence_penalty=0.3, logit_bias={3: -1.5},
                                allowed_token_ids=[3, 4, 5], bad_words=["foo"], min_tokens=2, max_tokens=9,
                                stop=["a", "b"], stop_token_ids=[7], ignore_eos=True, seed=11, logprobs=2,
                                skip_special_tokens=False)
    assert _sampling_params(build_parser().parse_args(["generate", "hi"])).temperature == 0.0  # greedy default


def test_generate_streams_and_reports_speed(tiny_checkpoint):  # noqa: F811
    r = run_cli("hello world", "--model", tiny_checkpoint, "--max-tokens", "6", "--ignore-eos", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "tokens/s" in r.stderr and "[6 tokens" in r.stderr


def test_batch_file_with_a_bad_line(tiny_checkpoint, tmp_path):  # noqa: F811
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join([json.dumps("plain string prompt"),
                              json.dumps({"id": "b", "prompt": "with overrides", "max_tokens": 3, "logprobs": 2}),
                              json.dumps({"id": "c", "prompt": ""}),
                              json.dumps({"id": "d", "messages": [{"role": "user", "content": "hi"}]})]) + "\n")
    r = run_cli("--model", tiny_checkpoint, "--prompts-file", str(src), "--output", str(dst), "--max-tokens", "5",
                "--ignore-eos")
    assert r.returncode == 1, r.stderr  # one request failed; the others completed
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [row["id"] for row in rows] == [0, "b", "c", "d"]
    assert [row["num_output_tokens"] for row in rows] == [5, 3, 0, 5]
    assert rows[2]["error"] and "empty" in rows[2]["error"]
    assert rows[3]["prompt"].startswith("<|im_start|>")
    assert "1 errors" in r.stderr
    # a line's logprobs come in its output row (they were dropped in batch mode), one list per sample
    [lps] = rows[1]["logprobs"]
    assert [lp["token_id"] for lp in lps] == rows[1]["token_ids"]
    assert all(lp["logprob"] <= 0 and lp["rank"] >= 1 and len(lp["top"]) == 2 for lp in lps)
    assert "logprobs" not in rows[0]


def test_exit_past_a_grammar_compile_that_timed_out(tiny_checkpoint, tmp_path):  # noqa: F811
    # the compile overruns --structured-timeout and keeps its worker thread (it cannot be
    # stopped): the request fails with the timeout, and the program exits with its code
    # (the interpreter's normal exit aborted: SIGABRT, rc 134)
    big = {"type": "object", "required": [f"k{i}" for i in range(60)],
           "properties": {f"k{i}": {"type": "string", "pattern": "[a-z]{1,20}@[a-z]{2,9}\\.(com|org)"}
                          for i in range(60)}}
    schema = tmp_path / "big.json"
    schema.write_text(json.dumps(big))
    r = run_cli("hi", "--model", tiny_checkpoint, "--device", "cpu", "--json-schema", str(schema),
                "--structured-timeout", "0.001")
    assert r.returncode == 1 and "grammar compilation timed out" in r.stderr, (r.returncode, r.stderr[-500:])


def test_program_exits_at_once_while_a_compile_runs(monkeypatch):
    # whether the abort above happens depends on timing (about half the runs of the old code),
    # so the exit path is checked on its own: a compile still running -> flush and os._exit
    # with main's code; none -> sys.exit
    import threading
    from specops import cli
    from specops.engine.structured_output import compiler_pool
    release, started = threading.Event(), threading.Event()
    pool = compiler_pool.CompilerPool(lambda spec: (started.set(), release.wait(30)), max_workers=1, timeout_s=10)
    exits = []

    class Left(Exception):
        pass

    def leave(how):
        def exit_(code):
            exits.append((how, code))
            raise Left           # neither exit returns
        return exit_

    monkeypatch.setattr(cli, "main", lambda: 1)
    monkeypatch.setattr(cli.os, "_exit", leave("os._exit"))
    monkeypatch.setattr(cli.sys, "exit", leave("sys.exit"))
    try:
        pool.submit("k", "spec")
        assert started.wait(10) and compiler_pool.compiling_now()
        with pytest.raises(Left):
            cli.run()
    finally:
        release.set()
        pool.shutdown()
    for _ in range(200):
        if not compiler_pool.compiling_now():
            break
        threading.Event().wait(0.05)
    with pytest.raises(Left):
        cli.run()
    assert exits == [("os._exit", 1), ("sys.exit", 1)]


def test_clear_errors(tmp_path):
    r = run_cli("hi", "--temperature", "-1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "error: --temperature: temperature must be in [0.0," in r.stderr   # the flag, then the field
    r = run_cli("hi", "--json-object", "--structured-timeout", "-1", "--model", str(tmp_path / "missing"))
    assert r.returncode == 2 and "error: --structured-timeout: structured_compile_timeout_s must be > 0" in r.stderr
    r = run_cli("hi", "--model", str(tmp_path / "missing"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = run_cli()
    assert r.returncode == 2 and "give a prompt" in r.stderr
    # each refused before any model is loaded, with the option named and no traceback
    cases = [(["--logit-bias", "[1, 2]"], "--logit-bias"),
             (["--logit-bias", '{"5": true}'], "the bias of token 5 must be a JSON number, got True"),   # was 1.0
             (["--logit-bias", '{"5": "1.5"}'], "the bias of token 5 must be a JSON number, got '1.5'"),
             (["--logit-bias", '{"x": 1}'], "token ids must be integers, got key 'x'"),
             (["--stop-token-ids", "5,x"], "--stop-token-ids"),
             (["--device", "foo"], "--device"),
             (["--num-spec-tokens", "3"], "--num-spec-tokens needs --spec"),
             (["--spec", "ngram", "--spec-synthetic-acceptance", "2"], "--spec-synthetic-acceptance")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "no CUDA device"))
    for argv, words in cases:
        r = run_cli("hi", "--model", str(tmp_path / "missing"), *argv)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
    # a prompts-file line with a misspelt key (it was dropped without a word): refused before the model loads
    src = tmp_path / "typo.jsonl"
    src.write_text('{"prompt": "a"}\n{"prompt": "b", "temprature": 0.5}\n')
    r = run_cli("--model", str(tmp_path / "missing"), "--prompts-file", str(src))
    assert r.returncode == 2 and "typo.jsonl:2: unknown key 'temprature'" in r.stderr and "temperature" in r.stderr
    # ids after the prompt do not swallow it: comma-separated, or the option repeated
    args = build_parser().parse_args(["generate", "--stop-token-ids", "5,7", "--stop-token-ids", "9", "hi"])
    assert args.prompt == "hi" and args.sp_stop_token_ids == [5, 7, 9]


def test_logit_bias_in_a_batch_file(tiny_checkpoint, tmp_path):  # noqa: F811
    """JSON object keys are strings: {"5": 100} in a line means token 5, as --logit-bias does; a key that is not
    a token id fails that line's request only, naming logit_bias."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join([json.dumps({"id": "a", "prompt": "hi", "logit_bias": {"5": 100.0}}),
                              json.dumps({"id": "b", "prompt": "hi", "logit_bias": {"x": 1.0}}),
                              json.dumps({"id": "c", "prompt": "hi"})]) + "\n")
    r = run_cli("--model", tiny_checkpoint, "--prompts-file", str(src), "--output", str(dst), "--max-tokens", "3",
                "--ignore-eos", "--device", "cpu")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    rows = {row["id"]: row for row in map(json.loads, dst.read_text().splitlines())}
    assert rows["a"]["error"] is None and rows["a"]["token_ids"] == [5, 5, 5]
    assert rows["b"]["error"] and "logit_bias" in rows["b"]["error"] and "'x'" in rows["b"]["error"]
    assert rows["c"]["error"] is None and rows["c"]["num_output_tokens"] == 3
    assert "1 errors" in r.stderr


def test_structured_outputs_and_extra_args_in_a_batch_file(tiny_checkpoint, tmp_path):  # noqa: F811
    """A line's "structured_outputs" (an object of StructuredOutputOptions fields, or null for none)
    and "extra_args" override the options for that line; a bad value fails that line alone. Both
    keys were refused as unknown, so a batch could not mix constraints."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join([json.dumps({"id": "a", "prompt": "hi", "structured_outputs": {"choice": ["yes", "no"]}}),
                              json.dumps({"id": "b", "prompt": "hi", "structured_outputs": None}),
                              json.dumps({"id": "c", "prompt": "hi", "structured_outputs": {"choice": []}}),
                              json.dumps({"id": "d", "prompt": "hi", "extra_args": {"num_spec_tokens": -1}}),
                              json.dumps({"id": "e", "prompt": "hi"})]) + "\n")
    r = run_cli("--model", tiny_checkpoint, "--prompts-file", str(src), "--output", str(dst), "--max-tokens", "3",
                "--ignore-eos", "--device", "cpu", "--regex", "[0-9]+", "--structured-timeout", "60")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    rows = {row["id"]: row for row in map(json.loads, dst.read_text().splitlines())}
    assert rows["a"]["error"] is None and rows["a"]["text"] in ("yes", "no"), rows["a"]
    assert rows["b"]["error"] is None and rows["b"]["num_output_tokens"] == 3     # null: no constraint
    assert rows["c"]["error"] and "choice" in rows["c"]["error"]
    assert rows["d"]["error"] and "num_spec_tokens" in rows["d"]["error"]
    assert rows["e"]["error"] is None and rows["e"]["text"].isdigit(), rows["e"]   # the --regex option
    assert "2 errors" in r.stderr


def test_bad_structured_outputs_lines_are_refused_before_the_model_loads(tmp_path):
    missing = str(tmp_path / "missing")
    for line, words in (({"structured_outputs": "json"}, '"structured_outputs" must be null or an object'),
                        ({"structured_outputs": {"regexp": "a"}}, '"structured_outputs" has an unknown key \'regexp\''),
                        ({"extra_args": [1]}, '"extra_args" must be null or an object')):
        src = tmp_path / "in.jsonl"
        src.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b", **line}) + "\n")
        r = run_cli("--model", missing, "--prompts-file", str(src))
        assert r.returncode == 2 and f"in.jsonl:2: {words}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # --structured-timeout needs a structured-output option or a line with "structured_outputs"
    src.write_text(json.dumps({"prompt": "a"}) + "\n")
    r = run_cli("--model", missing, "--prompts-file", str(src), "--structured-timeout", "5")
    assert r.returncode == 2 and "--structured-timeout needs a structured-output option" in r.stderr, r.stderr
    src.write_text(json.dumps({"prompt": "a", "structured_outputs": {"regex": "a+"}}) + "\n")
    r = run_cli("--model", missing, "--prompts-file", str(src), "--structured-timeout", "5")
    assert "structured-output option" not in r.stderr and "missing" in r.stderr, r.stderr   # got to the model


def test_options_nothing_would_use_are_refused(tmp_path, capsys):
    """An option that would be ignored is an error, before any model is loaded (the model path does not exist).
    In-process (no model is loaded, so this is fast); an exception would fail the test as a traceback would."""
    def run(*argv):
        rc = main(["generate", "--model", str(tmp_path / "missing_model"), *argv])
        return rc, capsys.readouterr().err

    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps("a prompt") + "\n")
    cases = [(["hi", "--system", "be brief"], "--system needs --chat"),
             (["--prompts-file", str(plain), "--system", "be brief"], "--system needs --chat"),
             (["hi", "--output", str(tmp_path / "out.jsonl")], "--output needs --prompts-file"),
             (["hi", "--spec", "ngram", "--draft-model", str(tmp_path / "draft")], "--draft-model needs --spec draft"),
             (["hi", "--draft-model", str(tmp_path / "draft")], "--draft-model needs --spec draft"),
             (["hi", "--reasoning-end", "</think>"], "--reasoning-end needs a structured-output option"),
             (["hi", "--structured-timeout", "5"], "--structured-timeout needs a structured-output option"),
             (["hi", "--top-p", "0.9"], "--top-p has no effect at temperature 0"),
             (["hi", "--top-k", "5", "--seed", "3", "--temperature", "0"], "--top-k, --seed have no effect"),
             (["hi", "--json-schema", ""], "--json-schema: cannot read ''"),   # was silently unconstrained
             (["hi", "--grammar", ""], "--grammar: cannot read ''"),
             (["--prompts-file", str(tmp_path / "missing.jsonl")], "--prompts-file"),
             (["--prompts-file", str(tmp_path)], "--prompts-file")]
    for argv, words in cases:
        rc, err = run(*argv)
        assert rc == 2 and words in err, (argv, err)
        assert "does not exist" not in err, (argv, err)  # refused before the model path was looked at
    rc, err = run("--prompts-file", str(tmp_path / "missing.jsonl"))
    assert "No such file" in err and "missing.jsonl" in err
    # the same options where they are used pass these checks (and fail on the missing model instead)
    msgs = tmp_path / "msgs.jsonl"
    msgs.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    for argv in (["hi", "--chat", "--system", "be brief"],
                 ["--prompts-file", str(msgs), "--system", "be brief"],
                 ["--prompts-file", str(plain), "--output", str(tmp_path / "out.jsonl")],
                 ["hi", "--spec", "draft", "--draft-model", str(tmp_path / "draft")],
                 ["hi", "--choice", "a,b", "--reasoning-end", "</think>", "--structured-timeout", "5"],
                 ["hi", "--temperature", "0.7", "--top-p", "0.9", "--seed", "1"]):
        rc, err = run(*argv)
        assert rc == 2 and "does not exist" in err, (argv, err)


def test_malformed_chat_lines_and_output_paths_are_refused_before_the_model_loads(tmp_path, capsys):
    """A "messages" line that is not chat messages, a non-string "prompt" with --chat and an --output that cannot
    be written: exit 2 naming the line or path, before the (missing) model is looked at. They were a jinja
    traceback, or an error after the whole batch had run."""
    def run(*argv):
        rc = main(["generate", "--model", str(tmp_path / "missing_model"), *argv])
        return rc, capsys.readouterr().err

    good = json.dumps({"prompt": "ok"})
    cases = [('{"messages": [{"role": "user"}]}', [],
              "in.jsonl:2: messages[0]['content'] must be a string, got nothing"),
             ('{"messages": [{"role": "user", "content": 5}]}', [], "messages[0]['content'] must be a string, got int"),
             ('{"messages": [{"content": "hi"}]}', [], "messages[0]['role'] must be a string"),
             ('{"messages": []}', [], "messages must be a non-empty list"),
             ('{"messages": [1, 2]}', [], "messages[0] must be a dict"),
             ('{"prompt": 5}', ["--chat"], 'with --chat, "prompt" must be a string'),
             # Python's json takes NaN / Infinity, but no output row could carry them back: once, the
             # line's error row failed to serialise and ended the batch, losing every later line
             ('{"prompt": [5, NaN]}', [], "in.jsonl:2: not JSON (NaN is not a JSON value)"),
             ('{"id": Infinity, "prompt": "x"}', [], "in.jsonl:2: not JSON (Infinity is not a JSON value)"),
             ('{"prompt": "x", "temperature": -Infinity}', [], "-Infinity is not a JSON value")]
    for line, extra, words in cases:
        src = tmp_path / "in.jsonl"
        src.write_text(good + "\n" + line + "\n")
        rc, err = run("--prompts-file", str(src), *extra)
        assert rc == 2 and words in err and "does not exist" not in err, (line, err)
    src = tmp_path / "in.jsonl"
    src.write_text(good + "\n")
    existing = tmp_path / "keep.jsonl"
    existing.write_text("old results\n")
    for out, words in [(tmp_path / "no_dir" / "out.jsonl", "no such directory"), (tmp_path, "is a directory")]:
        rc, err = run("--prompts-file", str(src), "--output", str(out))
        assert rc == 2 and words in err and "does not exist" not in err, (out, err)
    rc, err = run("--prompts-file", str(src), "--output", str(existing))   # a writable path: on to the model
    assert rc == 2 and "does not exist" in err and existing.read_text() == "old results\n"   # left untouched


def test_a_line_the_chat_template_refuses_fails_alone(capsys, tmp_path):
    """The template's own refusal (raise_exception, e.g. roles that do not alternate) fails that line only."""
    from types import SimpleNamespace

    from specops.cli import _generate_batch
    from specops.engine.outputs import CompletionOutput, RequestOutput

    class FakeLLM:
        engine = SimpleNamespace(spec_metrics=None, max_model_len=64, check_request=lambda prompt, params: [])

        def chat_prompt(self, messages):
            if messages[0]["role"] == "assistant":
                raise ValueError("chat template: conversations must start with a user message")
            return "<chat>" + messages[-1]["content"]

        def as_completed(self, prompts, params):   # the last prompt finishes first
            for i in reversed(range(len(prompts))):
                p = prompts[i]
                yield i, RequestOutput(str(i), p, [1], [CompletionOutput(0, p.upper(), [7, 8], finish_reason="length")],
                                       True)

    items = [{"messages": [{"role": "user", "content": "a"}]},
             {"messages": [{"role": "assistant", "content": "b"}]},
             {"prompt": "c"}]
    dst = tmp_path / "out.jsonl"
    args = build_parser().parse_args(["generate", "--prompts-file", "x", "--chat", "--output", str(dst)])
    rc = _generate_batch(FakeLLM(), args, items)
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert rc == 1 and "1 errors" in capsys.readouterr().err
    assert [r["text"] for r in rows] == ["<CHAT>A", "", "<CHAT>C"]
    assert rows[1]["finish_reason"] == "error" and "must start with a user message" in rows[1]["error"]
    assert rows[0]["error"] is None and rows[2]["token_ids"] == [7, 8]


def test_batch_lines_go_out_in_order_as_they_finish_and_ctrl_c_keeps_them(tmp_path):
    """Batch mode writes each line once it and the lines before it are done, in input order; Ctrl-C (a
    KeyboardInterrupt from the engine loop) leaves the lines already finished in --output."""
    from types import SimpleNamespace

    from specops.cli import _generate_batch
    from specops.engine.outputs import CompletionOutput, RequestOutput

    dst = tmp_path / "out.jsonl"
    seen = []

    class FakeLLM:
        engine = SimpleNamespace(spec_metrics=None, max_model_len=64, check_request=lambda prompt, params: [])

        def as_completed(self, prompts, params):
            for i in (1, 0, 3):   # line 2 never finishes: Ctrl-C comes first
                seen.append(dst.read_text())
                yield i, RequestOutput(str(i), prompts[i], [1],
                                       [CompletionOutput(0, prompts[i] + "!", [7], finish_reason="stop")], True)
            raise KeyboardInterrupt

    items = [{"prompt": p, "id": f"q{n}"} for n, p in enumerate("abcd")]
    args = build_parser().parse_args(["generate", "--prompts-file", "x", "--output", str(dst)])
    with pytest.raises(KeyboardInterrupt):
        _generate_batch(FakeLLM(), args, items)
    lines = [json.loads(line) for line in seen[2].splitlines()]
    assert seen[:2] == ["", ""] and [r["id"] for r in lines] == ["q0", "q1"]   # 1 waited for 0, then both went
    assert [json.loads(line)["text"] for line in dst.read_text().splitlines()] == ["a!", "b!"]   # 3 waits for 2


def test_single_prompt_chat_refused_by_the_template_is_an_error_not_a_traceback(capsys):
    """--chat on one prompt: no chat template, or a template that refuses the messages (e.g. a system
    role), prints `error: --chat: ...` and exits 2 before anything runs (it raised out of main)."""
    from specops.cli import _generate_one

    class FakeLLM:
        def chat_prompt(self, messages):
            raise ValueError("chat template: System role not supported")

        def stream(self, prompt, params):   # never reached
            raise AssertionError("the request ran")

    args = build_parser().parse_args(["generate", "hi", "--chat", "--system", "be brief"])
    assert _generate_one(FakeLLM(), args) == 2
    assert "error: --chat: chat template: System role not supported" in capsys.readouterr().err


def test_single_prompt_logprobs_of_several_samples_are_headed(capsys):
    """--logprobs with --n 2 on one prompt: each sample's logprob lines come under a header naming it."""
    from types import SimpleNamespace

    from specops.cli import _generate_one
    from specops.engine.outputs import CompletionOutput, RequestOutput
    from specops.engine.request import Logprob

    class FakeLLM:
        engine = SimpleNamespace(spec_metrics=None, max_model_len=64, check_request=lambda prompt, params: [])
        tokenizer = SimpleNamespace(id_to_token=lambda t: f"t{t}")

        def stream(self, prompt, params):
            samples = [CompletionOutput(i, "x", [5 + i], finish_reason="length",
                                        logprobs=[Logprob(5 + i, -0.5 - i, 1 + i, {5: -0.5})]) for i in range(2)]
            yield RequestOutput("0", prompt, [1], samples, True)

    args = build_parser().parse_args(["generate", "hi", "--n", "2", "--logprobs", "1", "--max-tokens", "1",
                                      "--temperature", "1"])
    assert _generate_one(FakeLLM(), args) == 0
    err = capsys.readouterr().err
    assert err.index("--- sample 0 logprobs") < err.index("'t5'\t-0.500") < err.index("--- sample 1 logprobs") \
        < err.index("'t6'\t-1.500")


def test_system_with_malformed_messages_reaches_the_check():
    """--system with a "messages" line that is not a list of dicts: the chat template's clear error, not an
    AttributeError from looking for a system message in it."""
    from specops.cli import _chat

    class FakeLLM:
        def chat_prompt(self, messages):
            return messages

    assert _chat(FakeLLM(), [1, 2], "be brief") == [{"role": "system", "content": "be brief"}, 1, 2]
    assert _chat(FakeLLM(), [{"role": "system", "content": "s"}], "be brief") == [{"role": "system", "content": "s"}]


def test_quickstart_default_model():
    from specops.engine.model.loader import default_model_path
    try:
        default_model_path()
    except FileNotFoundError as exc:  # pragma: no cover
        pytest.skip(str(exc))
    r = run_cli("--chat", "What is the capital of France?", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout and "tokens/s" in r.stderr


def test_batch_lines_stay_json_when_logprobs_meet_a_grammar(tiny_checkpoint, tmp_path):  # noqa: F811
    """A grammar masks tokens to -inf, and once a line asks for more top tokens than it allows, those
    fill the top-n: json.dumps wrote them as -Infinity, which is not JSON (strict parsers refused the
    line). A logprob that is not finite is now null."""
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"prompt": "hello world", "max_tokens": 3, "logprobs": 5}) + "\n")
    r = run_cli("--model", tiny_checkpoint, "--prompts-file", str(src), "--output", str(dst), "--choice", "yes,no",
                "--device", "cpu")
    assert r.returncode == 0, r.stderr

    def refuse(name):
        raise AssertionError(f"{name} in an output line")
    row = json.loads(dst.read_text(), parse_constant=refuse)
    tops = [v for step in row["logprobs"][0] for v in step["top"].values()]
    assert len(tops) == 5 * len(row["token_ids"]) and None in tops     # masked tokens: null, not -Infinity
    assert all(v is None or v <= 0 for v in tops)


def test_prompts_file_refuses_a_prompt_that_is_no_text_or_token_list(tmp_path):
    # {"prompt": 5} was read as the one-token prompt [5], or made the batch fail after the model
    # loaded with an error naming no line
    from specops.cli import _read_prompts
    for bad in (5, True, [], [1, "a"], [True], {"x": 1}):
        src = tmp_path / "in.jsonl"
        src.write_text(json.dumps("fine") + "\n" + json.dumps({"prompt": bad}) + "\n")
        with pytest.raises(ValueError, match=r'in.jsonl:2: "prompt" must be a string or a list of token ids'):
            _read_prompts(str(src))
    src.write_text(json.dumps({"prompt": [5, 6]}) + "\n" + json.dumps({"prompt": "text"}) + "\n")
    assert [item["prompt"] for item in _read_prompts(str(src))] == [[5, 6], "text"]


def test_prompts_file_lines_that_are_no_utf8_or_carry_prompt_and_messages_are_refused(tmp_path):
    from specops.cli import _read_prompts
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'"hi"\n"\xff\xfe"\n')   # the error named neither the file nor the line
    with pytest.raises(ValueError, match=r"in.jsonl:2: not UTF-8 text \(invalid start byte at byte 1\)"):
        _read_prompts(str(src))
    src.write_text(json.dumps({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}) + "\n")
    with pytest.raises(ValueError, match=r'in.jsonl:1: a line takes "prompt" or "messages", not both'):
        _read_prompts(str(src))   # "prompt" was dropped without a word


def test_one_token_and_a_context_cut_are_reported_as_such(tiny_checkpoint):  # noqa: F811
    r = run_cli("hello world", "--model", tiny_checkpoint, "--max-tokens", "1", "--ignore-eos", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "[1 tokens" in r.stderr and "decode - (no token after the first)" in r.stderr   # it read 0.0 tokens/s
    # a KV cache of one 16-token block: the engine caps max_model_len at 16, so 50 tokens cannot come
    r = run_cli("hello world", "--model", tiny_checkpoint, "--max-tokens", "50", "--ignore-eos", "--device", "cpu",
                "--num-kv-blocks", "1", "--block-size", "16")
    assert r.returncode == 0, r.stderr
    assert "finish: length" in r.stderr and "note: stopped at the context limit (max_model_len=16" in r.stderr


def test_batch_mode_notes_the_answers_the_context_cut(tiny_checkpoint, tmp_path):  # noqa: F811
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"prompt": "hello world", "max_tokens": 50}) + "\n"
                   + json.dumps({"prompt": "hello world", "max_tokens": 2}) + "\n")
    r = run_cli("--model", tiny_checkpoint, "--prompts-file", str(src), "--ignore-eos", "--device", "cpu",
                "--num-kv-blocks", "1", "--block-size", "16")
    assert r.returncode == 0, r.stderr
    assert "note: 1 answer(s) stopped at the context limit (max_model_len=16" in r.stderr, r.stderr


def _long_generation(tiny_checkpoint):  # noqa: F811
    return [sys.executable, "-m", "specops.cli", "generate", "hello world", "--model", tiny_checkpoint,
            "--max-tokens", "200", "--ignore-eos", "--device", "cpu"]


def test_a_closed_output_pipe_ends_without_a_traceback(tiny_checkpoint):  # noqa: F811
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # `specops generate ... | head -c 1`: the reader goes after the first byte
    p = subprocess.Popen(_long_generation(tiny_checkpoint), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert p.stdout.read(1)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 1 and "Traceback" not in err and "BrokenPipe" not in err, err



def test_a_closed_output_pipe_in_batch_mode_ends_without_an_error(tiny_checkpoint, tmp_path):  # noqa: F811
    # batch mode writes its lines to stdout: the BrokenPipeError was caught as an OSError of the
    # batch and reported as "error: [Errno 32] Broken pipe" with exit 2
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"prompt": "hello world"}) + "\n" for _ in range(200)))
    cmd = [sys.executable, "-m", "specops.cli", "generate", "--model", tiny_checkpoint, "--prompts-file", str(src),
           "--max-tokens", "8", "--ignore-eos", "--device", "cpu", "--max-num-seqs", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.stdout.read(1)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 1 and "Traceback" not in err and "Broken pipe" not in err, err


def test_ctrl_c_while_specops_imports_is_quiet():
    """The console script's module catches a Ctrl-C during `import specops` (torch, numpy and the
    ops: a second or more here), which specops.cli.run, not yet imported, could not. A
    KeyboardInterrupt raised inside numpy's C module init was swallowed there about one time in
    ten at 0.25-0.4 s (the run then went on to its end, exit 0, as in one CI run) or left numpy
    half-imported (ImportError): so the signal is sent at several times across the import."""
    import signal
    import time
    # the delays count from a marker the child prints once the interpreter is up (its start alone
    # took 0.035-0.1 s here, longer when the machine is busy; a signal before it is no concern of ours)
    child = "import sys; sys.stderr.write('up\\n'); sys.stderr.flush(); import _specops_main; _specops_main.main()"
    for delay in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.45):
        p = subprocess.Popen([sys.executable, "-c", child, "generate", "hi"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            for line in p.stderr:
                if line.decode().strip() == "up":
                    break
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
        finally:
            p.kill()
        assert p.returncode == 130 and "interrupted" in err.decode() and "Traceback" not in err.decode(), \
            (delay, err.decode())


# the import of specops.cli made to swallow a KeyboardInterrupt, as numpy's C module init can
_SWALLOWING_IMPORT = """
import importlib.abc, sys, time
class Swallow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "specops.cli":
            print("importing", file=sys.stderr, flush=True)
            try:
                time.sleep(30)
            except BaseException:
                pass
            sys.exit(0)
sys.meta_path.insert(0, Swallow())
import _specops_main
_specops_main.main()
"""


def test_ctrl_c_is_not_lost_to_an_import_that_swallows_it():
    """Ctrl-C ends the process even when the code being imported catches every exception: no
    KeyboardInterrupt is raised through the import, the process leaves at once (exit 130)."""
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-c", _SWALLOWING_IMPORT, "generate", "hi"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        before = []   # whatever is printed before the marker (a warning)
        for line in p.stderr:
            if line.decode().strip() == "importing":
                break
            before.append(line.decode())
        time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and "interrupted" in err.decode(), (p.returncode, before, err.decode())


def test_what_needs_the_model_is_refused_naming_the_option(tiny_checkpoint):  # noqa: F811
    """Checks that need the loaded model (its vocabulary, its context) ran as the request's own
    failure: "error: ValueError: top_k must be ..." and exit 1; now the option and exit 2."""
    base = ("hello world", "--model", tiny_checkpoint, "--device", "cpu", "--max-tokens", "2")
    for argv, words in [(["--temperature", "0.5", "--top-k", "100000"], "error: --top-k: top_k must be -1, 0 (off) or "
                                                                        "at most the vocabulary size"),
                        (["--logit-bias", '{"99999999": 1}'], "error: --logit-bias: logit_bias: token id 99999999 is "
                                                             "outside the vocabulary"),
                        (["--stop-token-ids", "99999999"], "error: --stop-token-ids: stop_token_ids: token id"),
                        (["--spec", "draft", "--draft-model", "/nonexistent"],
                         "error: --draft-model: draft_model: model path '/nonexistent' does not exist"),
                        (["--spec", "ngram", "--spec-batch-schedule", "bad"],
                         "error: --spec-batch-schedule: spec_batch_schedule: batch schedule must look like"),
                        (["--n", "3"], "error: --n 3 at temperature 0 (greedy, the default here) gives 3 identical")]:
        r = run_cli(*base, *argv)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
    r = run_cli("", "--model", tiny_checkpoint, "--device", "cpu")
    assert r.returncode == 2 and "error: prompt is empty" in r.stderr, r.stderr
    r = run_cli(*base, "--n", "2", "--temperature", "1", "--seed", "5")
    assert r.returncode == 0 and "finish: length, length]" in r.stderr, r.stderr   # every sample's reason


def test_ctrl_c_in_batch_mode_keeps_the_lines_written(tiny_checkpoint, tmp_path):  # noqa: F811
    """Ctrl-C during a batch run: "interrupted", exit 130, no traceback, and --output holds the lines
    finished before it, whole and in input order (a run of 400 prompts, 4 at a time, about a minute:
    the signal comes long before its end; a single streamed answer could end before it arrived)."""
    import signal
    import time
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "hello world"}) + "\n" for i in range(400)))
    p = subprocess.Popen([sys.executable, "-m", "specops.cli", "generate", "--model", tiny_checkpoint, "--prompts-file",
                          str(src), "--output", str(dst), "--max-tokens", "200", "--ignore-eos", "--device", "cpu",
                          "--max-num-seqs", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, OMP_NUM_THREADS="1"),
                         # a runner started in the background (`cmd &`) ignores SIGINT, and so would the
                         # child: it gets the default disposition back, as from a terminal
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not (dst.exists() and dst.read_text().count("\n") >= 1) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130 and "interrupted" in err.decode() and "Traceback" not in err.decode(), err.decode()
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert 1 <= len(rows) < 400 and [r["id"] for r in rows] == [f"q{i}" for i in range(len(rows))]
    assert all(r["num_output_tokens"] == 200 and r["error"] is None for r in rows)
