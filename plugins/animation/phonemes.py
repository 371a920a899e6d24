"""
A sentence's phonemes, word by word, from espeak-ng (its grapheme-to-phoneme
rules and dictionaries, maintained for about a hundred languages), for the
languages RPEngine speaks.

The phonemes come from a synthesis of the sentence (L{align_espeak}), not
from espeak-ng's text-to-phonemes call alone, because alignment needs that
synthesis anyway: it is the reference the sentence's real audio is warped
onto, and every phoneme in it has a known sample position.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpmiddleware.builtin.animation import align_espeak
from rpmiddleware.builtin.animation.align_words import Word, blankTags, wordsOf

#: The languages RPEngine's speech synthesis accepts (its core's list).
SPEECH_LANGUAGES: tuple[str, ...] = (
    "en",
    "ko",
    "es",
    "pt",
    "fr",
    "de",
    "it",
    "pl",
    "ru",
    "nl",
    "cs",
    "ar",
    "zh",
    "ja",
    "hu",
    "tr",
    "fi",
    "sk",
    "da",
    "hr",
    "el",
    "sv",
    "nb",
    "he",
    "uk",
    "id",
    "ms",
    "vi",
    "th",
    "ro",
    "bg",
)

#: The espeak-ng voice for a language, where it is not the language's code.
#: Chinese and Japanese have none: espeak-ng 1.51 reads Chinese characters
#: as tone digits in English and kanji as "Chinese letter", so a synthesis
#: of them is no reference; they fall back.
VOICES: dict[str, str | None] = {"en": "en-us", "zh": None, "ja": None}
#: Regional codes whose espeak-ng voice is named otherwise (its British
#: English is plain "en").
REGIONS: dict[str, str] = {"en-gb": "en", "en-uk": "en"}


def voiceFor(language: str) -> str | None:
    """
    The espeak-ng voice that phonemizes C{language} (a code such as C{"en"}
    or C{"pt-BR"}: the region's voice if espeak-ng has one, else the
    language's), or L{None} when it has none.
    """
    full = language.replace("_", "-").lower()
    primary = full.split("-", 1)[0]
    voice = VOICES.get(primary, primary)
    if voice is None or not primary.isalpha():
        return None
    # A regional code espeak-ng has a voice for (pt-BR, en-GB) is read so.
    regional = REGIONS.get(full, full)
    if full != primary and regional.replace("-", "").isalnum() and align_espeak.hasVoice(regional):
        return regional
    return voice if align_espeak.hasVoice(voice) else None


def languages() -> dict[str, str]:
    """
    RPEngine's speech languages, each with what alignment does for it:
    C{"phonemes"} (espeak-ng phonemizes it, and its audio is aligned) or
    C{"letters"} (no phonemes: visemes read off letters, spread evenly).
    """
    return {
        language: "phonemes" if voiceFor(language) is not None else "letters"
        for language in SPEECH_LANGUAGES
    }


@dataclass(frozen=True)
class Spoken:
    """A sentence phonemized: its synthesis, and each phoneme's word."""

    words: tuple[Word, ...]
    synthesis: align_espeak.Synthesis
    #: For each phoneme of the synthesis: its IPA name (C{""}: a pause) and
    #: the index in L{words} of its word (-1: a pause before the first).
    phonemes: tuple[tuple[int, str, int], ...]


def phonemize(text: str, language: str, variant: str = "") -> Spoken | None:
    """
    The phonemes of C{text}'s words, by a synthesis with espeak-ng (in one
    of its voice variants, C{"f3"}, if given), or L{None} when the language
    has no espeak-ng voice (or espeak-ng is not installed) or the text has
    no words.  Expression tags are left out.
    """
    voice = voiceFor(language)
    words = tuple(wordsOf(text))
    if voice is None or not words:
        return None
    synthesis = align_espeak.synthesize(blankTags(text), f"{voice}+{variant}" if variant else voice)
    return attribute(text, synthesis, voice)


def attribute(text: str, synthesis: align_espeak.Synthesis, voice: str) -> Spoken:
    """
    The words of C{text} and a synthesis of it, each phoneme given to its
    word (C{voice}: the language's espeak-ng voice, for reading words
    alone).  Also how the benchmark reads its test speech.
    """
    words = tuple(wordsOf(text))
    plain = blankTags(text)
    # Every code point -> the word it is in or last followed (a symbol
    # espeak-ng speaks, such as "%", belongs to the word before it).
    owner = [-1] * (len(plain) + 1)
    index = -1
    for at in range(len(plain) + 1):
        if index + 1 < len(words) and at >= words[index + 1].start:
            index += 1
        owner[at] = index
    phonemes: list[tuple[int, str, int]] = []
    for phoneme in synthesis.phonemes:
        name = phoneme.name
        if name.startswith("("):
            # A switch of language ("(en)"), not a sound.
            continue
        position = min(max(phoneme.textPosition, -1), len(plain))
        word = owner[position] if position >= 0 else -1
        if word < 0 and name:
            word = 0
        phonemes.append((phoneme.sample, name, word if name else -1))
    return Spoken(words, synthesis, tuple(_shareJoined(phonemes, words, voice)))


def _shareJoined(
    phonemes: list[tuple[int, str, int]], words: tuple[Word, ...], voice: str
) -> list[tuple[int, str, int]]:
    """
    espeak-ng joins some words into one (C{"from the"}: one word event, so
    every phoneme is the first word's and the next has none).  Share such a
    run's phonemes out in order, by how many phonemes each word has read
    alone, so that every word spoken has its own.
    """
    spoken = {owner for _, name, owner in phonemes if name}
    index = 0
    while index < len(words):
        joined = index + 1
        while joined < len(words) and joined not in spoken:
            joined += 1
        if index in spoken and joined > index + 1:
            group = [n for n, (_, name, owner) in enumerate(phonemes) if name and owner == index]
            counts = align_espeak.phonemeCounts([word.text for word in words[index:joined]], voice)
            total = max(sum(counts), 1)
            share = 0
            for offset, count in enumerate(counts):
                first = round(len(group) * share / total)
                share += count
                last = round(len(group) * share / total)
                for n in group[first:last]:
                    sample, name, _ = phonemes[n]
                    phonemes[n] = (sample, name, index + offset)
        index = joined
    return phonemes
