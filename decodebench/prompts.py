"""The built-in prompt set of the decode sweep, and a tokenizer-free stand-in for token ids.

Prompts range from one-line questions to multi-paragraph instructions and are ordered so that
any prefix (`builtin_prompts(5)`) mixes lengths. The set is versioned: results are only
comparable across runs that used the same set, so any edit to the texts (or their order) must
bump `PROMPT_SET_VERSION` (a test pins `prompt_set_digest()`).

Models that bring a tokenizer (a weights folder with ``tokenizer.json``) get the chat set
instead (`chat_prompts`, versioned by `CHAT_PROMPT_SET_VERSION`), tokenized with the model's own
tokenizer and chat template (`prompt_token_ids`).

For presets, token ids come from `pseudo_tokenize`, a deterministic stand-in until real tokenizers are wired
in: the text is cut into pieces (runs of letters in chunks of at most `MAX_LETTERS_PER_PIECE`,
single digits, single punctuation marks; whitespace dropped) and each piece is mapped to
`blake2b(piece) mod vocab_size`. Its piece counts are in the range of a BPE tokenizer on English
text (about 4 to 5 characters per token), so prefill lengths are realistic; the ids themselves
mean nothing to the model.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PROMPT_SET_VERSION = "builtin-v1"
MAX_LETTERS_PER_PIECE = 6

_PIECE_PATTERN = re.compile(r"[^\W\d_]+|\d|[^\w\s]|_")

_SHORT_QUESTIONS = (
    "What is the capital of Australia?",
    "How many legs does a spider have?",
    "Translate 'good morning' into French.",
    "Why is the sky blue?",
    "What does HTTP stand for?",
    "Name three prime numbers greater than 50.",
    "Who wrote the novel Pride and Prejudice?",
    "Is a tomato a fruit or a vegetable?",
)

_SENTENCE_INSTRUCTIONS = (
    "Write a haiku about the first snow of winter falling on a quiet city street.",
    "Explain in two sentences what a hash table is and why lookups are usually fast.",
    "Give me a short packing list for a three-day hiking trip in the mountains in early autumn.",
    "Summarise the plot of Romeo and Juliet for a ten-year-old in no more than five sentences.",
    "Suggest five names for a small bakery that specialises in sourdough bread and cinnamon rolls.",
    "Convert 72 degrees Fahrenheit to Celsius and show each step of the calculation.",
    "Write a polite email declining a meeting invitation because of a scheduling conflict.",
    "List the planets of the solar system in order from the Sun, with one fact about each.",
)

_PARAGRAPH_INSTRUCTIONS = (
    "You are a patient maths tutor. A student says that 0.999... repeating is smaller than 1 "
    "because it never quite gets there. Explain, without using calculus, why the two numbers "
    "are equal, and end with a question that checks whether the student understood.",
    "Read the following Python function and describe what it does, then point out one bug: "
    "def average(values): total = 0; for v in values: total += v; return total / len(values). "
    "Suggest a corrected version that handles an empty list sensibly.",
    "Compare trains and aeroplanes for a 600 kilometre trip between two European capitals. "
    "Consider total door-to-door time, cost, comfort, carbon emissions and how easy it is to "
    "work during the journey. Finish with a recommendation for a business traveller.",
    "Draft a short product description for a stainless steel water bottle that keeps drinks "
    "cold for 24 hours and hot for 12 hours. The audience is students; keep the tone friendly "
    "and mention that the bottle fits in a standard backpack side pocket.",
    "A recipe serves four people and needs 300 g of flour, 2 eggs, 250 ml of milk and a pinch "
    "of salt. Rewrite the ingredient list for six people, rounding to sensible kitchen amounts, "
    "and explain how you handled the eggs.",
    "Explain the difference between a process and a thread to a junior developer. Use an "
    "analogy from everyday life, then describe one situation in which each is the better choice.",
)

_MULTI_PARAGRAPH_INSTRUCTIONS = (
    "I am planning a small vegetable garden on a sunny balcony of about four square metres. "
    "I have never grown anything before.\n\n"
    "Which five vegetables or herbs would you recommend for a beginner, and why? For each, tell "
    "me what size of container it needs, how often to water it and when I can expect a harvest.\n\n"
    "Finally, list the three most common beginner mistakes and how to avoid them.",
    "Act as a reviewer for a pull request. The change adds a retry loop around a network call: "
    "it retries forever with a fixed one-second delay and logs every failure at error level.\n\n"
    "Write a review comment that explains the risks of this approach, proposes a better retry "
    "policy with exponential back-off, jitter and a maximum number of attempts, and suggests "
    "how to log failures without flooding the logs.\n\n"
    "Keep the tone constructive and end with a short summary of the requested changes.",
    "Write the opening scene of a short story. The setting is a lighthouse on a remote island "
    "during a storm. The keeper, an old woman named Ada, receives a radio message from a ship "
    "that should not exist.\n\n"
    "Use vivid sensory detail, keep the dialogue sparse, and end the scene on a question that "
    "makes the reader want to continue. Aim for about three paragraphs.",
    "You are helping a city council decide whether to convert a four-lane road into two lanes "
    "with protected bicycle lanes.\n\n"
    "Outline the main arguments for and against the change, covering safety, traffic flow, "
    "local businesses, emissions and cost. For each argument, say what evidence would help "
    "settle it.\n\n"
    "Then propose a six-month pilot that would let the council measure the effects before "
    "making a permanent decision, including which numbers to collect and how often.",
    "Explain how public-key cryptography lets two people who have never met agree on a secret "
    "over an open channel.\n\n"
    "Start with an intuitive analogy using padlocks and boxes, then describe the Diffie-Hellman "
    "key exchange with small numbers that a reader can check by hand. Mention why the numbers "
    "used in practice are much larger and what would break if they were small.\n\n"
    "Close with one paragraph on why an attacker who can modify messages, not only read them, "
    "needs a different defence.",
    "Design a weekly study plan for someone preparing for a data structures and algorithms "
    "interview in eight weeks while working full time. They can study one hour on weekdays and "
    "four hours on each weekend day.\n\n"
    "Split the plan into phases, say which topics belong in each phase (arrays and strings, "
    "hash maps, trees, graphs, dynamic programming, system design basics), and include regular "
    "review and mock interviews.\n\n"
    "Present the result as a list of weeks with goals, and add advice on what to do if the "
    "person falls behind.",
    "Here are notes from a team meeting: the release slipped by a week because the payment "
    "integration failed in staging; the cause was an expired test certificate; support tickets "
    "rose by 20 percent after the last update, mostly about login; the design team wants two "
    "more days for the onboarding screens; and the marketing launch date is fixed.\n\n"
    "Turn these notes into a concise status update for executives with a headline, three "
    "bullet points of risks with owners, and a proposed new timeline. Avoid jargon and keep "
    "it under two hundred words.",
    "Describe, step by step, how a large language model generates text one token at a time on "
    "a phone.\n\n"
    "Cover what happens during prefill and during decode, what the key-value cache stores and "
    "why it grows with the context, and why decoding speed is usually limited by memory "
    "bandwidth rather than by arithmetic.\n\n"
    "Finish with two practical techniques that make decoding faster on a device with limited "
    "memory bandwidth, and explain the trade-off of each.",
)


def _interleave(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """Round-robin over the length groups, so any prefix of the set mixes short and long."""
    longest = max(len(group) for group in groups)
    return tuple(group[i] for i in range(longest) for group in groups if i < len(group))


_BUILTIN_TEXTS = _interleave(
    _SHORT_QUESTIONS, _SENTENCE_INSTRUCTIONS, _PARAGRAPH_INSTRUCTIONS, _MULTI_PARAGRAPH_INSTRUCTIONS
)
BUILTIN_PROMPT_COUNT = len(_BUILTIN_TEXTS)


class Prompt(BaseModel):
    """One prompt of the built-in set; `index` is its stable position in the set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    text: str = Field(min_length=1)

    def token_ids(self, vocab_size: int) -> list[int]:
        return pseudo_tokenize(self.text, vocab_size)

    @property
    def token_count(self) -> int:
        return len(_pieces(self.text))


def _pieces(text: str) -> list[str]:
    pieces: list[str] = []
    for match in _PIECE_PATTERN.finditer(text):
        piece = match.group()
        pieces.extend(
            piece[start : start + MAX_LETTERS_PER_PIECE]
            for start in range(0, len(piece), MAX_LETTERS_PER_PIECE)
        )
    return pieces


def pseudo_tokenize(text: str, vocab_size: int) -> list[int]:
    """Stand-in token ids for `text` (see module docstring); stable across runs and machines."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
    return [
        int.from_bytes(hashlib.blake2b(piece.encode(), digest_size=8).digest(), "big") % vocab_size
        for piece in _pieces(text)
    ]


def builtin_prompts(count: int) -> list[Prompt]:
    """The first `count` prompts of the built-in set, in order."""
    if not 1 <= count <= BUILTIN_PROMPT_COUNT:
        raise ValueError(f"prompt count must be between 1 and {BUILTIN_PROMPT_COUNT}, got {count}")
    return [Prompt(index=index, text=text) for index, text in enumerate(_BUILTIN_TEXTS[:count])]


def prompt_set_digest() -> str:
    """sha256 of the set's texts: changes whenever any prompt does."""
    digest = hashlib.sha256(PROMPT_SET_VERSION.encode())
    for text in _BUILTIN_TEXTS:
        digest.update(b"\x00" + text.encode())
    return digest.hexdigest()


# --- chat prompts for models that bring a tokenizer ------------------------------------------
# Short enough that chat template + prompt + 16 decoded tokens fit a context of 256 (the longest
# is under 130 tokens with SmolLM2's template); varied tasks, interleaved by length like above.
CHAT_PROMPT_SET_VERSION = "chat-v1"

_CHAT_SHORT = (
    "What is the capital of France?",
    "How many days are there in a leap year?",
    "Translate 'thank you very much' into Spanish.",
    "What is 12 times 12?",
    "Name the largest planet in the solar system.",
    "What colour do you get by mixing blue and yellow?",
    "Who painted the Mona Lisa?",
    "Give me a synonym for 'happy'.",
    "What is the boiling point of water in Celsius?",
    "Spell the word 'necessary' backwards.",
)

_CHAT_SENTENCE = (
    "Write a Python function that returns the square of a number.",
    "List three fruits that are rich in vitamin C.",
    "Summarise in one sentence: the meeting was moved from Monday to Wednesday because the "
    "projector was broken.",
    "Translate into German: The train leaves at eight o'clock tomorrow morning.",
    "Explain in one sentence what photosynthesis is.",
    "Give two tips for sleeping better at night.",
    "Write a short greeting for a birthday card for my grandmother.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a cat that loves to sleep in the sun.",
    "Write a SQL query that counts the rows in a table called orders.",
)

_CHAT_PARAGRAPH = (
    "Summarise this text in one sentence: Bees collect nectar from flowers and turn it into "
    "honey. While they move from flower to flower, they carry pollen, which helps plants "
    "produce fruit and seeds. Without bees, many crops would yield far less food.",
    "Here is a list of tasks: buy milk, call the dentist, finish the report, water the plants. "
    "Sort them by urgency and explain your order briefly.",
    "Read this code and say what it prints: x = [1, 2, 3]; y = x; y.append(4); print(len(x)).",
    "A shop sells pencils at 30 cents each. Anna buys 7 pencils and pays with a 5 euro note. "
    "How much change does she get? Show your working.",
    "Write a four-line poem about the sea at night, with a rhyme at the end of each pair of lines.",
    "Translate this sentence into French and then into Italian: I would like a cup of coffee "
    "with milk, please.",
    "Explain to a child why we have seasons, using the tilt of the Earth, in three short "
    "sentences.",
    "My laptop battery drains quickly even when I am only reading documents. List four things "
    "I could check or change to make it last longer.",
    "Compare cats and dogs as pets for a family living in a small flat, with one advantage of "
    "each.",
    "Write a JavaScript function called isEven that takes a number and returns true when it is "
    "even, and show one example call.",
)

CHAT_PROMPT_TEXTS = _interleave(_CHAT_SHORT, _CHAT_SENTENCE, _CHAT_PARAGRAPH)
CHAT_PROMPT_COUNT = len(CHAT_PROMPT_TEXTS)


def chat_prompts(count: int = CHAT_PROMPT_COUNT) -> list[Prompt]:
    """The first `count` chat prompts, in order (for models with a tokenizer)."""
    if not 1 <= count <= CHAT_PROMPT_COUNT:
        raise ValueError(f"prompt count must be between 1 and {CHAT_PROMPT_COUNT}, got {count}")
    return [Prompt(index=index, text=text) for index, text in enumerate(CHAT_PROMPT_TEXTS[:count])]


def has_tokenizer(weights: Path | None) -> bool:
    """Whether a weights folder carries its tokenizer (else prompts are pseudo-tokenized)."""
    return weights is not None and (
        (weights / "tokenizer.json").is_file() or (weights / "tokenizer.model").is_file()
    )


def chat_token_ids(weights: Path, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text as a user turn, through the model's own tokenizer and chat
    template (plain encoding when it has no template), ready for the assistant's answer."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(weights))
    if tokenizer.chat_template is None:
        return [[int(token) for token in tokenizer(text)["input_ids"]] for text in texts]
    encoded = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        for text in texts
    ]
    return [[int(token) for token in item["input_ids"]] for item in encoded]


def prompt_token_ids(
    prompts: Sequence[Prompt], vocab_size: int, weights: Path | None = None
) -> list[list[int]]:
    """Real token ids when ``weights`` has a tokenizer, the pseudo-token stand-in otherwise."""
    if has_tokenizer(weights):
        assert weights is not None
        return chat_token_ids(weights, [prompt.text for prompt in prompts])
    return [prompt.token_ids(vocab_size) for prompt in prompts]


def decode_text(weights: Path, token_ids: Sequence[int]) -> str:
    """The text of generated token ids (special tokens kept: they show where an answer ends)."""
    from transformers import AutoTokenizer

    return str(AutoTokenizer.from_pretrained(str(weights)).decode(list(token_ids)))
