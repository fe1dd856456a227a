"""Prompts cut from the standard library: sizes, distinctness, determinism, unique prefixes."""

from __future__ import annotations

from weightsmith.bench.workloads import build_prompts, interleaved, stdlib_corpus, unique_prefix


def test_corpus_is_python_source() -> None:
    corpus = stdlib_corpus()
    assert len(corpus) > 100
    names = {name for name, _ in corpus}
    assert "json/decoder.py" in names or "os.py" in names
    assert not any(name.startswith("test/") for name in names)


def test_prompts_have_the_asked_sizes_and_differ() -> None:
    prompts = build_prompts([80, 600, 9000], 4, 3.0, seed=0)
    assert [p.target_tokens for p in prompts] == [80] * 4 + [600] * 4 + [9000] * 4
    for p in prompts:
        assert 0.5 * p.target_tokens * 3.0 <= len(p.text) <= p.target_tokens * 3.0
    assert len({p.text for p in prompts}) == len(prompts)
    assert len({p.key for p in prompts}) == len(prompts)


def _code_tokenizer(text: str) -> int:
    """A stand-in tokenizer whose chars-per-token varies with content, as real ones do on code."""
    return len(text.split()) + text.count("(") + text.count("\n") + len(text) // 16


def test_prompts_are_cut_to_length_with_the_servers_tokenizer() -> None:
    targets = [80, 600, 2048]
    prompts = build_prompts(targets, 4, 3.2, seed=3, count_tokens=_code_tokenizer)
    for p in prompts:
        assert abs(_code_tokenizer(p.text) - p.target_tokens) <= max(1, 0.02 * p.target_tokens), p.source
    # the same prompts sized by the ratio alone miss by far more
    rough = build_prompts(targets, 4, 3.2, seed=3)
    worst = max(abs(_code_tokenizer(p.text) - p.target_tokens) / p.target_tokens for p in rough)
    assert worst > 0.1


def test_same_seed_same_prompts_other_seed_other_prompts() -> None:
    a = build_prompts([200], 3, 3.2, seed=7)
    assert a == build_prompts([200], 3, 3.2, seed=7)
    assert [p.text for p in a] != [p.text for p in build_prompts([200], 3, 3.2, seed=8)]


def test_unique_prefixes_and_a_fixed_interleaving() -> None:
    assert len({unique_prefix() for _ in range(100)}) == 100
    prompts = build_prompts([80, 600], 5, 3.0, seed=0)
    order = interleaved(prompts, 0)
    assert sorted(p.key for p in order) == sorted(p.key for p in prompts)
    assert order == interleaved(prompts, 0)
    assert [p.target_tokens for p in order] != sorted(p.target_tokens for p in order)
