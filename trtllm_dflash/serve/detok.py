"""Incremental detokenization: a request's text grows by each round's tokens, and reads at every
step as the whole-sequence decode of its tokens would, less a character whose bytes are not all
there yet (serve/batcher.py streams the deltas; the whole decode is taken once, when the request
ends, so the last update is exactly it).

Decoding every request's whole output every round costs O(output) a round (transformers walks
each token id in Python first: 0.4 µs a token); these cost what the new tokens cost.

  `stream_for` picks:
  ByteStream    a byte-level BPE (a ByteLevel decoder: GPT-2, Llama 3, Qwen, the tiny pair): its decode
                is the UTF-8 of its tokens' bytes, so an incremental UTF-8 decoder over each new
                token's bytes (looked up once per token id) is exact, and holds back exactly the
                bytes of a character still incomplete
  WindowStream  any other tokenizer (SentencePiece's Metaspace and byte fallback: Llama 2,
                Mistral): the new tokens decoded after a short look-back window of the tokens
                before them, whose own text is subtracted (the window gives merges, leading spaces
                and split characters their context), held back while it ends in U+FFFD. Exact on
                text that is valid UTF-8; byte fallback decodes a run of byte tokens that is not to
                one U+FFFD a byte, its valid bytes too, which a stream may have shown already
                (tokenizers' DecodeStream does the same, and costs 26 µs a round of 8 tokens where
                ByteStream costs 2)
  WholeStream   the whole decode each time: a tokenizer that cleans up spaces after decoding
                (clean_up_tokenization_spaces) can change text already streamed
"""

from __future__ import annotations

import codecs
from typing import Protocol, Sequence

REPLACEMENT = "\ufffd"  # what a byte-level decode gives for a character whose bytes are incomplete


class TextStream(Protocol):
    text: str  # the text of every token so far, complete characters only

    def add(self, ids: Sequence[int]) -> str:
        """The tokens of a round: the text so far (self.text)."""

    def final(self) -> str:
        """The whole decode of every token added (a trailing incomplete character included)."""


def whole_decode(tokenizer, ids: Sequence[int], skip_special_tokens: bool) -> str:
    """tokenizer.decode of the whole sequence; the keyword only when asked (a tokenizer with a plain
    decode(ids) serves the rest)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True) if skip_special_tokens else tokenizer.decode(list(ids))


def stream_for(tokenizer, skip_special_tokens: bool = False) -> TextStream:
    """The incremental decoder that reproduces tokenizer.decode for this tokenizer."""
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return WholeStream(tokenizer, skip_special_tokens)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.decoder).__name__ == "ByteLevel":
        return ByteStream(_byte_table(backend), skip_special_tokens)
    if backend is not None:  # its Rust decode, as transformers' fast decode without the clean-up
        return WindowStream(lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens))
    return WindowStream(lambda ids: whole_decode(tokenizer, ids, skip_special_tokens))


class ByteTable:
    """Each token id's bytes under a ByteLevel decoder (tokenizers' decoders/byte_level.rs: a token's
    characters through the byte-level alphabet, or the token's own UTF-8 when a character is not in
    it, as an added token's may not be); special tokens give none when skipped."""

    def __init__(self, backend):
        from tokenizers.pre_tokenizers import ByteLevel

        self.backend = backend
        self.chars = {c: i for i, c in enumerate(_byte_alphabet(ByteLevel))}
        self.special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        self.of: dict[int, bytes] = {}

    def bytes_of(self, ids: Sequence[int], skip_special_tokens: bool) -> bytes:
        of = self.of
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special]
        try:  # every id seen before (all but a request's first rounds): one pass in C
            return b"".join(map(of.__getitem__, ids))
        except KeyError:
            return b"".join([of[i] if i in of else self._add(i) for i in ids])

    def _add(self, i: int) -> bytes:
        token = self.backend.id_to_token(i)
        if token is None:
            out = b""
        elif all(c in self.chars for c in token):
            out = bytes(self.chars[c] for c in token)
        else:
            out = token.encode()
        self.of[i] = out
        return out


def _byte_alphabet(ByteLevel) -> list[str]:
    """The character of each byte 0..255 (GPT-2's bytes_to_unicode, as tokenizers builds it)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    assert set(out.values()) == set(ByteLevel.alphabet()), "tokenizers' byte-level alphabet changed"
    return [out[b] for b in range(256)]


_TABLES: dict[int, ByteTable] = {}


def _byte_table(backend) -> ByteTable:
    """One table per tokenizer (its entries fill as token ids are first seen)."""
    table = _TABLES.get(id(backend))
    if table is None or table.backend is not backend:
        table = _TABLES[id(backend)] = ByteTable(backend)
    return table


class ByteStream:
    """An incremental UTF-8 decoder (errors="replace", as the whole decode's from_utf8_lossy) over
    the new tokens' bytes."""

    def __init__(self, table: ByteTable, skip_special_tokens: bool):
        self.table, self.skip, self.text = table, skip_special_tokens, ""
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    appends = True  # text only grows: push's piece is all that changed

    def add(self, ids: Sequence[int]) -> str:
        if ids:
            self.text += self.utf8.decode(self.table.bytes_of(ids, self.skip))
        return self.text

    def push(self, ids: Sequence[int]) -> str:
        """add, returning what the text grew by."""
        piece = self.utf8.decode(self.table.bytes_of(ids, self.skip)) if ids else ""
        self.text += piece
        return piece

    def final(self) -> str:
        return self.text + self.utf8.decode(b"", final=True)


class WindowStream:
    """The new tokens decoded with the tokens since the last emitted text as look-back; their
    text is what the window adds to the look-back's own text. decode(ids) -> text: the
    tokenizer's, with the request's skip_special_tokens."""

    def __init__(self, decode):
        self.decode, self.text = decode, ""
        self.ids: list[int] = []
        self.prefix = 0  # the look-back window starts here
        self.read = 0  # tokens before this are in self.text

    def add(self, ids: Sequence[int]) -> str:
        if not ids:
            return self.text
        self.ids.extend(ids)
        before = self.decode(self.ids[self.prefix : self.read])
        window = self.decode(self.ids[self.prefix :])
        if len(window) > len(before) and not window.endswith(REPLACEMENT) and window.startswith(before):
            self.text += window[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
        return self.text

    def final(self) -> str:
        return self.decode(self.ids)


class WholeStream:
    """The whole decode every time (less an incomplete character at its end)."""

    def __init__(self, tokenizer, skip_special_tokens: bool):
        self.tokenizer, self.skip, self.text = tokenizer, skip_special_tokens, ""
        self.ids: list[int] = []

    def add(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        self.text = whole_decode(self.tokenizer, self.ids, self.skip).rstrip(REPLACEMENT)
        return self.text

    def final(self) -> str:
        return whole_decode(self.tokenizer, self.ids, self.skip)
