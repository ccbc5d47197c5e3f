"""Incremental detokenisation with stop strings.

Each new token is decoded in a small window (a few tokens of context before it), and the
text is only extended when the window decodes to more characters than its prefix without
ending in a partial UTF-8 sequence (U+FFFD): that keeps the cost per token constant and
the streamed text equal to decoding the whole output at once. While a request runs, the
last (longest stop string - 1) characters are held back, since they may start a stop string.
"""

from __future__ import annotations

_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """Text of one request's output, built token by token.

    Parameters
    ----------
    tokenizer
        Has ``decode(ids, skip_special_tokens=...) -> str``.
    prompt_token_ids : list[int]
        The last few prompt tokens give the first output token its left context.
    skip_special_tokens : bool
    stop : list[str] or None
        Stop strings.
    include_stop_str_in_output : bool
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True,
                 stop: list[str] | None = None, include_stop_str_in_output: bool = False):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.stop = list(stop or [])
        self.include_stop = include_stop_str_in_output
        # text a stop string may still cut; none when the stop string stays in the output
        self.hold = 0 if include_stop_str_in_output else max((len(s) for s in self.stop), default=1) - 1
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.num_emitted = 0  # characters of text already handed out

    def update(self, new_token_ids: list[int], check_stop: bool = True) -> str | None:
        """Add tokens; return the stop string that ended the text, if one did (text is cut there)."""
        start = len(self.text)
        for tok in new_token_ids:
            self.ids.append(tok)
            prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=self.skip)
            full = self.tokenizer.decode(self.ids[self.prefix_offset:], skip_special_tokens=self.skip)
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                self.text += full[len(prefix):]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._check_stop(start) if check_stop and self.stop and len(self.text) > start else None

    def flush(self, check_stop: bool = True) -> str | None:
        """At the end: add what is still pending (an incomplete UTF-8 tail decodes to U+FFFD);
        return the stop string that ended the text in it, if one did (text is cut there)."""
        start = len(self.text)
        if self.read_offset < len(self.ids):
            prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], skip_special_tokens=self.skip)
            full = self.tokenizer.decode(self.ids[self.prefix_offset:], skip_special_tokens=self.skip)
            self.text += full[len(prefix):]
            self.prefix_offset = self.read_offset = len(self.ids)
        return self._check_stop(start) if check_stop and self.stop and len(self.text) > start else None

    def _check_stop(self, start: int) -> str | None:
        best = None
        for s in self.stop:
            idx = self.text.find(s, max(0, start - len(s) + 1))
            if idx >= 0 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return None
        idx, s = best
        self.text = self.text[:idx + len(s) if self.include_stop else idx]
        return s

    def take_delta(self, finished: bool) -> str:
        """Text not handed out yet (holding back a possible stop-string start while running)."""
        end = len(self.text) if finished else max(self.num_emitted, len(self.text) - self.hold)
        delta = self.text[self.num_emitted:end]
        self.num_emitted = end
        return delta
