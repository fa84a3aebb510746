"""Text in and out of a model, exactly as transformers makes it for the same folder.

Prompts are tokenized, and tokens decoded, with Hugging Face's `tokenizers` library (the
Rust library under transformers' fast tokenizers) from the baked `tokenizer.json`, not
with onnxruntime-genai's tokenizer, which in 0.18 never adds BOS to raw text, ignores
the normalizer (NFC) and decodes special tokens as spaces (docs/troubleshooting.md).

What transformers adds on top of `tokenizer.json` (BOS/EOS that `add_bos_token` or the
post-processor put around raw text, the special-tokens map a chat template sees, the
control tokens) is recorded by the bake in `ortserve-text.json`; a folder without that
record uses `tokenizer.json`'s own post-processor and `tokenizer_config.json`.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortserve.core import chat
from ortserve.core.errors import InvalidRequestError, ModelIntegrityError

TEXT_RECORD = "ortserve-text.json"
# The raw text whose tokens, with and without special tokens, show what a tokenizer adds.
WRAP_PROBE = "Hello"


def wrapping(full: Sequence[int], plain: Sequence[int]) -> tuple[list[int], list[int]] | None:
    """The ids before and after `plain` (a text's tokens) inside `full` (the same text's
    tokens with special tokens added), or None when `plain` is not inside `full`."""
    for start in range(len(full) - len(plain) + 1):
        if list(full[start : start + len(plain)]) == list(plain):
            return list(full[:start]), list(full[start + len(plain) :])
    return None


@dataclass(frozen=True)
class TextRecord:
    """What transformers does with text for a model, recorded at bake time.

    Attributes:
        prefix_ids: Tokens transformers puts before raw text (`tokenizer(text)`), e.g. BOS.
        suffix_ids: Tokens it puts after raw text (rare: an EOS some tokenizers add).
        template_tokens: The special-tokens map a chat template sees (bos_token, ...).
        control_tokens: Added tokens a chat template writes as control tokens (transformers'
            `sanitize_control_tokens` encodes these as plain text in user strings).
    """

    prefix_ids: tuple[int, ...] = ()
    suffix_ids: tuple[int, ...] = ()
    template_tokens: dict[str, str] = field(default_factory=dict)
    control_tokens: tuple[str, ...] = ()

    def write(self, folder: Path) -> None:
        """Write the record into a model folder."""
        (folder / TEXT_RECORD).write_text(
            json.dumps(asdict(self), ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )

    @classmethod
    def read(cls, folder: Path) -> TextRecord | None:
        """The folder's record, or None for a folder baked before records existed."""
        path = folder / TEXT_RECORD
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                prefix_ids=tuple(int(i) for i in data["prefix_ids"]),
                suffix_ids=tuple(int(i) for i in data["suffix_ids"]),
                template_tokens={str(k): str(v) for k, v in data["template_tokens"].items()},
                control_tokens=tuple(str(t) for t in data["control_tokens"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelIntegrityError(f"{path} is not a valid text record: {exc}") from exc


class TextCodec:
    """Tokenizer, chat template and stream decoder of one model folder.

    Attributes:
        template: The chat template, or None when the model has none.
        record: What transformers adds around text (see TextRecord).
    """

    def __init__(self, folder: Path) -> None:
        """Load `folder/tokenizer.json` and the chat template.

        Raises:
            ModelIntegrityError: tokenizer.json is missing or unreadable.
        """
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a plain Exception
            raise ModelIntegrityError(f"{path} cannot be loaded: {exc}") from exc
        self._plain: Any = None
        self._plain_lock = threading.Lock()
        self.template = chat.find_template(folder)
        record = TextRecord.read(folder)
        if record is None:
            record = self._record_from_files(folder)
        self.record = record
        self._controls = chat.control_token_pattern(record.control_tokens)
        markers = f"{chat.MARK_START}({self._controls.pattern}){chat.MARK_END}"
        self._marked = re.compile(f"{markers}|[{chat.MARK_START}{chat.MARK_END}]")
        self._newline = self._tokenizer.encode("\n", add_special_tokens=False).ids

    def _record_from_files(self, folder: Path) -> TextRecord:
        """A record for a folder baked without one: tokenizer.json's post-processor decides
        BOS/EOS, and every special added token is a control token."""
        plain = self._tokenizer.encode(WRAP_PROBE, add_special_tokens=False).ids
        full = self._tokenizer.encode(WRAP_PROBE, add_special_tokens=True).ids
        prefix, suffix = wrapping(full, plain) or ([], [])
        controls = tuple(
            t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.special
        )
        return TextRecord(
            prefix_ids=tuple(prefix),
            suffix_ids=tuple(suffix),
            template_tokens=chat.special_tokens(folder),
            control_tokens=controls,
        )

    # -- encoding ---------------------------------------------------------------------

    def _encode(self, text: str, *, plain: bool = False) -> list[int]:
        tokenizer = self._plain_tokenizer() if plain else self._tokenizer
        try:
            return list(tokenizer.encode(text, add_special_tokens=False).ids)
        except Exception as exc:  # the Rust library raises a plain Exception
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRequestError(
                    "the text contains a lone surrogate (not valid Unicode)"
                ) from None
            raise InvalidRequestError(f"the text cannot be tokenized: {exc}") from exc

    def _plain_tokenizer(self) -> Any:
        """A second tokenizer that matches no added tokens (special-token strings stay
        text); a copy, so that requests encoding in other threads are not affected."""
        with self._plain_lock:
            if self._plain is None:
                from tokenizers import Tokenizer

                plain = Tokenizer.from_str(self._tokenizer.to_str())
                plain.encode_special_tokens = True
                self._plain = plain
            return self._plain

    def encode(self, text: str) -> list[int]:
        """Token ids of a raw prompt, as transformers' `tokenizer(text)` gives them (BOS
        and the normalizer included)."""
        return [*self.record.prefix_ids, *self._encode(text), *self.record.suffix_ids]

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt string for chat `messages`, with the assistant's turn opened.

        Raises:
            InvalidRequestError: The model has no chat template, or it rejects the messages.
        """
        return self._render(messages, template_kwargs, marked=False)

    def encode_chat(
        self,
        messages: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        *,
        plain_control_tokens: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a chat prompt, as transformers' `apply_chat_template(...,
        add_generation_prompt=True, tokenize=True)` gives them (no BOS added: the template
        writes its own).

        With `plain_control_tokens`, control-token strings the caller sent (in messages or
        template kwargs) are encoded as plain text, as transformers does with
        `sanitize_control_tokens=True`: a user cannot forge a turn.

        Raises:
            InvalidRequestError: No template, the template rejects the messages, or a
                control token cannot be written as plain text with this tokenizer.
        """
        rendered = self._render(messages, template_kwargs, marked=plain_control_tokens, tools=tools)
        return self._encode_marked(rendered) if plain_control_tokens else self._encode(rendered)

    def _encode_marked(self, rendered: str) -> list[int]:
        # [text, marked token, text, ...]; None where a lone marker was (a template's string
        # method split a marked token): dropped, but it still separates the text around it.
        pieces = self._marked.split(rendered)
        ids = self._encode(pieces[0])
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1
            piece_ids = self._encode_piece(piece, as_text)
            if as_text and self._tokenizer.token_to_id(piece) in piece_ids:
                raise InvalidRequestError(
                    f"{piece!r} cannot be sent as plain text: this tokenizer makes it from text"
                )
            ids += piece_ids
        return ids

    def _encode_piece(self, piece: str, plain: bool) -> list[int]:
        # After a newline, so that SentencePiece-style tokenizers add no prefix space at the
        # start of a piece; the newline's ids are removed again (as transformers does).
        ids = self._encode("\n" + piece, plain=plain)
        if ids[: len(self._newline)] == self._newline:
            return ids[len(self._newline) :]
        return self._encode(piece, plain=plain)

    def _render(
        self,
        messages: Sequence[dict[str, Any]],
        template_kwargs: dict[str, Any] | None,
        *,
        marked: bool,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """The chat prompt; `marked`: the caller's control tokens wrapped in markers."""
        if self.template is None:
            raise InvalidRequestError("this model has no chat template: use a plain prompt")
        return chat.render(
            self.template,
            messages,
            tokens=self.record.template_tokens,
            template_kwargs=template_kwargs,
            mark_controls=self._controls if marked else None,
            tools=tools,
        )

    # -- decoding ---------------------------------------------------------------------

    @functools.cache  # noqa: B019  # one codec per model, for the process's life
    def _byte_level(self) -> bool:
        """Whether the decoder maps GPT-2's byte alphabet back to bytes (read on first use:
        only log probabilities need it)."""
        decoder = self._tokenizer.decoder
        return decoder is not None and b'"ByteLevel"' in decoder.__getstate__()

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (what OpenAI's logprobs call `bytes`): a
        byte-level BPE token's characters mapped back to bytes (GPT-2's alphabet), a
        SentencePiece byte token (`<0xE2>`) as its byte, `▁` as a space, else the
        token's text in UTF-8 (special tokens: their content)."""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return b""
        if self._byte_level():
            alphabet = _byte_alphabet()
            if all(ch in alphabet for ch in piece):
                return bytes(alphabet[ch] for ch in piece)
            return piece.encode("utf-8")  # an added token, written as itself
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text of `token_ids` without special tokens, as transformers'
        `decode(ids, skip_special_tokens=True)`."""
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def stream_decoder(self) -> Callable[[int], str]:
        """A function from each new token to its text piece: empty while a character's bytes
        are incomplete and for special tokens; the pieces join to `decode`'s text."""
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=True)
        tokenizer = self._tokenizer

        def step(token: int) -> str:
            return stream.step(tokenizer, token) or ""

        return step

    def detokenize(self, token_ids: Iterable[int]) -> Iterator[str]:
        """Text pieces of a token stream, one per token (see `stream_decoder`), and, once
        the tokens end inside a character, one more piece with what `decode` makes of the
        incomplete bytes (U+FFFD): the pieces always join to `decode`'s text."""
        step = self.stream_decoder()
        seen: list[int] = []
        emitted = 0
        for token in token_ids:
            seen.append(token)
            piece = step(token)
            emitted += len(piece)
            yield piece
        whole = self.decode(seen) if seen else ""
        if len(whole) > emitted:
            yield whole[emitted:]


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character → byte: printable bytes stand for
    themselves, the others for the characters from U+0100 on (as `bytes_to_unicode`)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            alphabet[chr(256 + extra)] = b
            extra += 1
    return alphabet
