import pytest

from decodebench.prompts import (
    BUILTIN_PROMPT_COUNT,
    PROMPT_SET_VERSION,
    Prompt,
    builtin_prompts,
    prompt_set_digest,
    pseudo_tokenize,
)


def test_the_set_has_thirty_distinct_prompts_indexed_in_order() -> None:
    prompts = builtin_prompts(30)

    assert BUILTIN_PROMPT_COUNT == 30
    assert [prompt.index for prompt in prompts] == list(range(30))
    assert len({prompt.text for prompt in prompts}) == 30


def test_editing_the_set_requires_a_new_version() -> None:
    # If this fails you changed a prompt or the order: bump PROMPT_SET_VERSION and re-pin.
    assert PROMPT_SET_VERSION == "builtin-v1"
    assert prompt_set_digest() == "ec8726043c68242c8b7c425eed8b6baae35d450aa0b7493170d3cc12c3cc8683"


def test_lengths_range_from_short_questions_to_multi_paragraph_instructions() -> None:
    counts = [prompt.token_count for prompt in builtin_prompts(30)]

    assert min(counts) <= 10
    assert max(counts) >= 100
    assert sum("\n\n" in prompt.text for prompt in builtin_prompts(30)) >= 5


def test_any_prefix_mixes_short_and_long_prompts() -> None:
    counts = [prompt.token_count for prompt in builtin_prompts(4)]

    assert min(counts) < 15
    assert max(counts) > 60


def test_a_prefix_is_the_same_prompts_as_the_full_set() -> None:
    assert builtin_prompts(5) == builtin_prompts(30)[:5]


@pytest.mark.parametrize("count", [0, 31, -1])
def test_counts_outside_the_set_are_refused(count: int) -> None:
    with pytest.raises(ValueError, match="between 1 and 30"):
        builtin_prompts(count)


def test_token_ids_are_deterministic_and_within_the_vocabulary() -> None:
    prompt = builtin_prompts(30)[3]

    ids = prompt.token_ids(512)

    assert ids == prompt.token_ids(512)
    assert len(ids) == prompt.token_count
    assert all(0 <= token < 512 for token in ids)
    assert len(set(ids)) > len(ids) // 2


def test_token_ids_are_pinned_across_machines_and_versions() -> None:
    # blake2b of each piece, mod the vocab: changing the scheme changes every prompt_tokens value.
    assert pseudo_tokenize("Why is the sky blue?", 102400) == [
        6990,
        90834,
        18990,
        7093,
        83931,
        67561,
    ]


def test_pieces_split_words_digits_and_punctuation() -> None:
    # "internationalisation" is 20 letters: 4 pieces of at most 6; "42" is two digits; "!" one.
    assert len(pseudo_tokenize("internationalisation 42!", 1000)) == 4 + 2 + 1
    assert pseudo_tokenize("   ", 1000) == []


def test_same_piece_gets_the_same_id_and_different_pieces_usually_differ() -> None:
    ids = pseudo_tokenize("cat dog cat", 102400)

    assert ids[0] == ids[2]
    assert ids[0] != ids[1]


def test_vocab_size_must_hold_at_least_two_ids() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        pseudo_tokenize("hello", 1)


def test_prompt_is_immutable() -> None:
    prompt = Prompt(index=0, text="hello")

    with pytest.raises(ValueError):
        prompt.text = "changed"  # type: ignore[misc]
