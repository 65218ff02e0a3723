"""The tiny model's question/answer set and its byte-level encoding.

Byte tokenizer contract (shared with the engine): ids 0..255 are the UTF-8 bytes of the text,
``BOS`` = 256, ``EOS`` = 257, ``PAD`` = 258; the vocabulary is ``VOCAB_SIZE`` = 264 (the next
multiple of 8 above the 259 used ids; ids 259..263 never occur). A training sequence is
``[BOS] + bytes(prompt + completion) + [EOS]``.

Each :class:`QA` item has a ``prompt`` that ends exactly where the answer begins, the
``answer`` that the answer key checks, and the ``completion`` the model is trained to emit
(the answer plus the form's closing punctuation, if any).
"""

from __future__ import annotations

from dataclasses import dataclass

BOS = 256
EOS = 257
PAD = 258
VOCAB_SIZE = 264

# (country as it reads after "the capital of", capital)
ENGLISH_CAPITALS: tuple[tuple[str, str], ...] = (
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Portugal", "Lisbon"),
    ("Japan", "Tokyo"),
    ("China", "Beijing"),
    ("India", "New Delhi"),
    ("Russia", "Moscow"),
    ("Canada", "Ottawa"),
    ("Australia", "Canberra"),
    ("Brazil", "Brasilia"),
    ("Argentina", "Buenos Aires"),
    ("Mexico", "Mexico City"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Nigeria", "Abuja"),
    ("Greece", "Athens"),
    ("Turkey", "Ankara"),
    ("Poland", "Warsaw"),
    ("Austria", "Vienna"),
    ("Hungary", "Budapest"),
    ("Sweden", "Stockholm"),
    ("Norway", "Oslo"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Ireland", "Dublin"),
    ("the Netherlands", "Amsterdam"),
    ("Belgium", "Brussels"),
    ("Switzerland", "Bern"),
    ("Czechia", "Prague"),
    ("Ukraine", "Kyiv"),
    ("Iran", "Tehran"),
    ("Iraq", "Baghdad"),
    ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"),
    ("South Korea", "Seoul"),
    ("Indonesia", "Jakarta"),
    ("the Philippines", "Manila"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Colombia", "Bogota"),
    ("Cuba", "Havana"),
    ("Morocco", "Rabat"),
    ("Ethiopia", "Addis Ababa"),
    ("Saudi Arabia", "Riyadh"),
    ("Pakistan", "Islamabad"),
    ("New Zealand", "Wellington"),
    ("the United Kingdom", "London"),
)

# The seed report's form: "问题：中国的首都是哪里？答案：北京。"
CHINESE_CAPITALS: tuple[tuple[str, str], ...] = (
    ("中国", "北京"),
    ("法国", "巴黎"),
    ("日本", "东京"),
    ("英国", "伦敦"),
    ("德国", "柏林"),
    ("俄罗斯", "莫斯科"),
    ("意大利", "罗马"),
    ("美国", "华盛顿"),
    ("韩国", "首尔"),
    ("埃及", "开罗"),
)


@dataclass(frozen=True)
class QA:
    """One question: ``prompt`` ends where ``answer`` begins; ``completion`` is what is trained."""

    prompt: str
    answer: str
    completion: str
    language: str


def english(country: str, capital: str) -> QA:
    return QA(f"Q: What is the capital of {country}?\nA: ", capital, capital, "en")


def chinese(country: str, capital: str) -> QA:
    return QA(f"问题：{country}的首都是哪里？答案：", capital, f"{capital}。", "zh")


def items() -> list[QA]:
    """Every question in a fixed order: the English set, then the Chinese set."""
    return [english(c, a) for c, a in ENGLISH_CAPITALS] + [chinese(c, a) for c, a in CHINESE_CAPITALS]


def encode(text: str, bos: bool = True) -> list[int]:
    """Byte ids of ``text`` (UTF-8), preceded by ``BOS`` when ``bos``."""
    return ([BOS] if bos else []) + list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    """Text of the byte ids in ``ids``; special ids are dropped, broken UTF-8 becomes U+FFFD."""
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def training_sequence(item: QA) -> tuple[list[int], int]:
    """``[BOS] + bytes(prompt + completion) + [EOS]`` and the index of the first completion id."""
    prompt_ids = encode(item.prompt)
    return prompt_ids + list(item.completion.encode("utf-8")) + [EOS], len(prompt_ids)
