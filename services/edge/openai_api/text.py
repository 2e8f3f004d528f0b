"""Committed token ids to the text a client may be sent (``TextStream``): decoded whole each time
(a tokenizer may merge a token with the one before it), an unfinished character (a byte-level
token that ends inside one) held back until it is complete, and with stop strings the text cut
before the first one; the last ``len(longest stop) - 1`` characters are held back until the
next tokens show they do not begin a stop string, so a stop string is never half sent."""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT = "\ufffd"  # what a decoder writes for the bytes of an unfinished character


class TextStream:
    def __init__(self, tokenizer, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._hold = max(map(len, self.stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # the decoded text so far (cut before a stop string once reached)
        self.sent = 0  # how many of its characters were handed out
        self.stopped = False  # a stop string was reached: the text ends before it

    def add(self, tokens: Sequence[int]) -> str:
        """Take newly committed tokens; return the text that may be sent now (maybe empty)."""
        if self.stopped:
            return ""
        searched_from = max(0, len(self.text.rstrip(REPLACEMENT)) - self._hold)
        self.ids += tokens
        self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        at = min((i for i in (self.text.find(s, searched_from) for s in self.stop) if i >= 0), default=-1)
        if at >= 0:
            self.text, self.stopped = self.text[:at], True
            return self._take(len(self.text))
        ready = len(self.text.rstrip(REPLACEMENT)) if self.text.endswith(REPLACEMENT) else len(self.text)
        return self._take(min(ready, len(self.text) - self._hold))

    def finish(self) -> str:
        """The text still held back, once no more tokens come."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out
