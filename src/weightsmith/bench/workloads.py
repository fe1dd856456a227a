"""Code-continuation prompts cut from Python's own standard library source.

Every machine that runs weightsmith has this corpus, so two people comparing numbers send the same
kind of text; code is also what speculative decoding is usually deployed for. Prompts are cut to
length with the server's own tokenizer where it offers `/tokenize` (from a chars-per-token
estimate otherwise); the token counts reported are the ones the server gives in `usage`.

Each measured request starts with its own random line, so no request shares a prefix with any
earlier one: prefix caching cannot flatter TTFT, yet the body after that line is the same for
every arm, which is what pairs the prompts across arms.
"""

from __future__ import annotations

import random
import sysconfig
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from weightsmith.core.errors import WeightsmithError

#: Used when the server cannot tokenize; typical of code for Llama-style BPE vocabularies.
FALLBACK_CHARS_PER_TOKEN = 3.2
#: How close to its target length a prompt is cut when the server can count tokens.
SIZE_TOLERANCE = 0.02
_MIN_FILE_CHARS = 4000


@dataclass(frozen=True)
class Prompt:
    """One prompt body, identified across arms by (target_tokens, index)."""

    target_tokens: int
    index: int
    source: str
    text: str

    @property
    def key(self) -> str:
        """Stable identity used to pair requests between arms."""
        return f"{self.target_tokens}:{self.index}"


def unique_prefix() -> str:
    """A first line no other request has, so the server's prefix cache cannot hit: the random
    part comes right after `#`, so at most the first token or two can match an earlier prompt."""
    return f"#{uuid.uuid4().hex} request\n"


@lru_cache(maxsize=1)
def stdlib_corpus() -> tuple[tuple[str, str], ...]:
    """(relative path, source text) of the standard library's .py files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "test/", "dist-packages/")) or "/tests/" in rel:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) >= _MIN_FILE_CHARS:
            files.append((rel, text))
    if not files:
        raise WeightsmithError(f"no Python source found under {root} to cut prompts from")
    return tuple(files)


def _cut(text: str, start: int, n_chars: int) -> str:
    """About `n_chars` of `text` from the line that starts at or after `start`, ending at whitespace."""
    begin = text.find("\n", start)
    begin = 0 if begin < 0 or start == 0 else begin + 1
    piece = text[begin : begin + n_chars]
    cut = max(piece.rfind(" "), piece.rfind("\n"))
    if cut >= len(piece) - 12:  # end on a word boundary when one is near
        piece = piece[: cut + 1]
    return piece


def _window(corpus: tuple[tuple[str, str], ...], rng: random.Random, n_chars: int) -> tuple[int, int, str, str]:
    """A random start in a random file, with enough following text (later files appended) to
    grow the prompt to three times its first estimate."""
    file_index = rng.randrange(len(corpus))
    rel, text = corpus[file_index]
    start = rng.randrange(len(text))
    sources = [rel]
    j = file_index
    while len(text) < start + 3 * n_chars + 200 and len(sources) < len(corpus):
        j = (j + 1) % len(corpus)
        sources.append(corpus[j][0])
        text = text + "\n\n" + corpus[j][1]
    source = sources[0] if len(sources) == 1 else f"{sources[0]} (+{len(sources) - 1} more)"
    return file_index, start, text, source


def _fit(text: str, start: int, n_chars: int, target: int, count_tokens: Callable[[str], int | None]) -> str:
    """Re-cut from `start` until the tokenizer counts `target` tokens (within tolerance):
    proportional steps, kept inside the bracket of lengths already seen too short and too long."""
    low, high = 0, len(text)
    body = _cut(text, start, n_chars)
    for _step in range(16):
        n = count_tokens(body)
        if not n or abs(n - target) <= max(1.0, SIZE_TOLERANCE * target):
            break
        if n < target:
            low = max(low, n_chars)
        else:
            high = min(high, n_chars)
        guess = round(n_chars * target / n)
        if not low < guess < high:
            guess = (low + high) // 2
        if guess in (n_chars, low, high):
            break
        n_chars = guess
        body = _cut(text, start, n_chars)
    return body


def build_prompts(
    lengths: list[int],
    per_length: int,
    chars_per_token: float,
    seed: int,
    count_tokens: Callable[[str], int | None] | None = None,
) -> list[Prompt]:
    """`per_length` distinct prompts of each target token length.

    The first cut uses `chars_per_token`; with `count_tokens` (the server's tokenizer) each prompt
    is then re-cut until it is within `SIZE_TOLERANCE` of its target, because code varies too much
    in characters per token for one ratio to size a prompt. Long targets run on into the next
    files, so 9000-token prompts exist at all; the generator is seeded so that every run of the
    same arms file gets the same bodies.
    """
    corpus = stdlib_corpus()
    rng = random.Random(seed)
    prompts: list[Prompt] = []
    for target in lengths:
        first_guess = max(16, round(target * chars_per_token))
        used: set[tuple[int, int]] = set()
        for index in range(per_length):
            for _attempt in range(100):
                file_index, start, text, source = _window(corpus, rng, first_guess)
                if (file_index, start // first_guess) not in used:
                    used.add((file_index, start // first_guess))
                    break
            body = _cut(text, start, first_guess)
            if count_tokens is not None:
                body = _fit(text, start, first_guess, target, count_tokens)
            prompts.append(Prompt(target_tokens=target, index=index, source=source, text=body))
    return prompts


def interleaved(prompts: list[Prompt], seed: int) -> list[Prompt]:
    """The measured order: lengths mixed, the same for every arm, so slow drift during a window
    does not line up with prompt length."""
    order = list(prompts)
    random.Random(seed + 1).shuffle(order)
    return order
