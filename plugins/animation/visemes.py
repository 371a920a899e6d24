"""
The viseme set marks speak in: Amazon Polly's, with a jaw opening for each.

Polly's set is the one game developers already have tables and rigs for
(Polly's speech marks are what issue 35 asks marks to look like), and its
seventeen names are short ASCII strings a Godot or Unity script can switch
on.  Engines that only move a jaw read L{MOUTH}: how open the mouth is for
a viseme, 0 (closed) to 1 (wide open).

Phonemes reach this module as IPA (espeak-ng's phoneme events in IPA mode):
L{visemeOf} maps one phoneme to its viseme by its first letter (length
marks, stress and tone marks and most diacritics do not change the mouth's
shape).  A language with no phonemes falls back to letters:
L{letterVisemes} maps a written word's letters, which is rough but keeps a
mouth moving.
"""

from __future__ import annotations

import unicodedata

#: Polly's visemes, in the order its documentation lists them.
VISEMES: tuple[str, ...] = (
    "p",
    "t",
    "S",
    "T",
    "f",
    "k",
    "i",
    "r",
    "s",
    "u",
    "@",
    "a",
    "e",
    "E",
    "o",
    "O",
    "sil",
)

#: How open the jaw is for each viseme, 0 (lips closed) to 1 (wide open):
#: for engines that animate one jaw bone or one blend shape.  Chosen by the
#: mouth's shape in each group (bilabials shut it, open vowels open it most).
MOUTH: dict[str, float] = {
    "p": 0.0,
    "t": 0.25,
    "S": 0.3,
    "T": 0.2,
    "f": 0.1,
    "k": 0.35,
    "i": 0.35,
    "r": 0.4,
    "s": 0.15,
    "u": 0.3,
    "@": 0.5,
    "a": 1.0,
    "e": 0.6,
    "E": 0.75,
    "o": 0.7,
    "O": 0.85,
    "sil": 0.0,
}

#: IPA letter -> viseme.  Polly's groups: p (p b m), f (f v), T (th), t (t d
#: n l and other alveolars), S (postalveolar: sh zh ch j), s (s z), k (k g ng
#: and the back consonants h w), r (r and other rhotics), i (i I j), u (u U
#: w), @ (schwa and the central vowels), a (open a), e (close-mid front), E
#: (open-mid front and ash), o (close-mid back), O (open-mid back).
IPA: dict[str, str] = {}


def _group(viseme: str, letters: str) -> None:
    for letter in letters:
        IPA[letter] = viseme


_group("p", "pbmɓʙɱ" + "ɸβ")
_group("f", "fvʋ")
_group("T", "θð")
_group("t", "tdnlɗɫɬɮɲʎʈɖɳɭɾɽ")
_group("S", "ʃʒʧʤɕʑçʝ")
_group("s", "szʂʐʦʣ")
_group("k", "kgɡŋxɣχʁqɢħʕhɦʔɰ")
_group("r", "rɹɻʀɚɝ")
_group("i", "iɪjyʏɨ")
_group("u", "uʊwɯʉɥ")
_group("@", "əɘɵɜɞʌ")
_group("a", "aɑɐ")
_group("e", "eøɤ")
_group("E", "ɛœæ")
_group("o", "o")
_group("O", "ɔɒ")

#: Letters of the Latin, Greek and Cyrillic scripts -> a viseme, for the
#: letters fallback (a language without phonemes).
LETTERS: dict[str, str] = {}
for _letters, _viseme in (
    ("pbmπβμпбм", "p"),
    ("fvφфв", "f"),
    ("θ", "T"),
    ("tdnlτδνλтднл", "t"),
    ("jшжчщ", "S"),
    ("szxσςζξсзц", "s"),
    ("kgqchγκχкгх", "k"),
    ("rρр", "r"),
    ("iyιυηийы", "i"),
    ("uwουу", "u"),
    ("aαа", "a"),
    ("eεэе", "e"),
    ("oοωо", "o"),
):
    for _letter in _letters:
        LETTERS[_letter] = _viseme


def visemeOf(phoneme: str) -> str:
    """
    The viseme of one IPA phoneme (as espeak-ng names it in IPA mode:
    possibly with stress and length marks, or two letters for a diphthong
    or an affricate).  The mouth's shape is that of the first letter that
    has one; a phoneme with none (a pause, a stress mark alone) is "sil".
    """
    if phoneme in ("tʃ", "dʒ", "ts", "dz"):
        return "S" if phoneme[1] in "ʃʒ" else "s"
    for letter in unicodedata.normalize("NFD", phoneme):
        viseme = IPA.get(letter)
        if viseme is not None:
            return viseme
    return "sil"


def letterVisemes(word: str) -> list[str]:
    """
    Visemes read off a word's letters, for languages with no phonemes:
    one per letter that has a mouth shape, runs of the same one merged.
    """
    shapes: list[str] = []
    for letter in unicodedata.normalize("NFD", word.lower()):
        viseme = LETTERS.get(letter)
        if viseme is not None and (not shapes or shapes[-1] != viseme):
            shapes.append(viseme)
    return shapes or ["@"]
