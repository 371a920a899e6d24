"""
What a sentence of a character's line feels, read from its words.

No package fits the job: the NRC Emotion Lexicon (and C{nrclex}, which
ships it) may be used for non-commercial research only; VADER (MIT) knows
how positive a sentence is, not which feeling; the classifiers that do know
download a model at run time.  So this is a small lexicon written for
rpmiddleware (the project's own, under its licence): about 440
English words and interjections a character in a game says when it feels
one of Ekman's six (L{rpmiddleware.plugin.FEELINGS}), each with a weight,
plus the few rules that matter most in dialogue: a negation just before a
word ("not happy") takes its feeling away (and turns joy to sadness),
intensifiers ("so", "very") and exclamation marks make it stronger.

It is a reading of the words, not of the situation: "I could kill you"
reads as anger whatever the scene.  A sentence with no cue reads as
C{neutral}; the feelings plugin then lets the character's mood carry it
(L{rpmiddleware.builtin.animation.feelings_mood}).  English only: other
languages read as neutral unless they use the interjections and emoticons
shared with English.  It takes some tens of microseconds a sentence (52 us
for a 76-character one, measured on a loaded 2-core host; words are
cached), so the plugin reads each sentence on the reactor the moment its
text is complete, adding no latency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from rpmiddleware.plugin import FEELINGS

NEUTRAL = FEELINGS[0]


def _words(weight: float, text: str) -> dict[str, float]:
    return {word: weight for word in text.split()}


#: Each feeling's words (lowercase, as written or as a stem that
#: L{_stems} reaches), with how strongly each says it: 1.0 plainly, 1.5
#: strongly, 0.6 faintly.
LEXICON: dict[str, dict[str, float]] = {
    "joy": {
        **_words(
            1.0,
            "happy glad joy joyful pleased delighted delight cheerful cheer cheers love loved "
            "lovely wonderful great excellent fantastic marvelous marvellous splendid "
            "brilliant beautiful enjoy enjoyed fun laugh laughed laughing smile smiled "
            "smiling grin grinning celebrate celebration hooray hurray yay huzzah congratulations "
            "congrats thank thanks grateful thankful relief relieved proud pride "
            "glorious bliss blissful merry jolly content satisfied success succeeded won "
            "victory triumph darling hopeful excited exciting thrilled thrill perfect nice "
            "glee gleeful adore adorable charming pleasure pleasant lucky blessed",
        ),
        **_words(
            1.5,
            "ecstatic overjoyed elated euphoric jubilant haha hahaha hehe heh amazing awesome "
            "incredible superb magnificent",
        ),
        **_words(0.6, "okay alright sure yes good fine best welcome kind friend hope sweet"),
    },
    "sadness": {
        **_words(
            1.0,
            "sad sadly sorrow sorry unhappy miserable misery grief grieve grieving mourn mourning "
            "cry cried crying tears tear weep wept weeping lonely alone lost lose loss gone "
            "dead death died die dying funeral grave miss missed missing regret regrets "
            "disappointed disappointing disappointment hurt hurts heartbroken broken gloomy "
            "gloom depressed depressing despair hopeless hopelessly pity poor unfortunately "
            "alas farewell goodbye sigh sighed lament melancholy forlorn bleak empty "
            "abandoned forgotten failed failure suffering suffer pain painful ache aching "
            "weary",
        ),
        **_words(1.5, "devastated heartbreaking wretched inconsolable anguish tragic tragedy"),
        **_words(0.6, "shame unfortunate tired poor"),
    },
    "anger": {
        **_words(
            1.0,
            "angry anger mad furious fury rage raging enraged outraged outrage hate hated "
            "hatred annoyed annoying irritated irritating infuriating livid hostile "
            "damn damned dammit curse bloody hell fool fools idiot idiots "
            "stupid liar lies lied betray betrayed traitor cheat cheated dare "
            "shut kill punish revenge vengeance destroy crush smash "
            "threaten insult insulted offended resent resentment "
            "bastard scum coward cowards thief thieves worthless useless pathetic "
            "ridiculous unacceptable",
        ),
        **_words(1.5, "furiously seething wrath despise loathe"),
        **_words(0.6, "bother bothered grr hmph enough stop fight warn warning"),
    },
    "fear": {
        **_words(
            1.0,
            "afraid scared scary fear feared fearful frightened frightening terrified "
            "terrifying terror horror horrified panic panicked nervous anxious anxiety worry "
            "worried worrying dread dreadful danger dangerous threat flee "
            "fled beware monster monsters ghost ghosts haunted "
            "darkness creature wolves trapped attacked "
            "hunted chased alarmed uneasy tremble trembling shaking shiver "
            "shivering unsafe doom doomed cursed eerie creepy",
        ),
        **_words(1.5, "petrified horrifying nightmare nightmares"),
        **_words(0.6, "hurry careful hide escape risk risky dark shadows strange"),
    },
    "disgust": {
        **_words(
            1.0,
            "disgusting disgusted disgust gross revolting repulsive repugnant vile nasty "
            "filthy filth foul stink stinks stinking stench smell smells rotten rot rotting "
            "sick sickening nauseating nausea vomit puke slime slimy greasy dirty grime "
            "sewage rats rat maggots maggot worms worm mold moldy mouldy putrid rancid "
            "ugly hideous horrible awful yuck yuk eww ew ugh bleh blech distasteful "
            "shameful despicable contempt creep",
        ),
        **_words(1.5, "abhorrent abominable loathsome"),
    },
    "surprise": {
        **_words(
            1.0,
            "surprise surprised surprising wow whoa woah aha astonishing astonished "
            "amazed unexpected unexpectedly suddenly sudden "
            "shocked shock shocking stunned unbelievable goodness gosh gods "
            "seriously huh",
        ),
        **_words(1.5, "astounding astounded flabbergasted speechless omg"),
        **_words(0.6, "oh ah curious interesting odd wait realize realized"),
    },
}

#: Emoticons and emoji a chat-style line may carry, by feeling.
SYMBOLS: dict[str, str] = {
    ":)": "joy",
    ":-)": "joy",
    ":d": "joy",
    "😀": "joy",
    "😄": "joy",
    "😂": "joy",
    "😊": "joy",
    ":(": "sadness",
    ":-(": "sadness",
    ":'(": "sadness",
    "😢": "sadness",
    "😭": "sadness",
    "😠": "anger",
    "😡": "anger",
    "😨": "fear",
    "😱": "fear",
    "🤢": "disgust",
    "🤮": "disgust",
    ":o": "surprise",
    "😮": "surprise",
    "😲": "surprise",
}

#: Words that take away the feeling of one of the next three words.
NEGATIONS = frozenset(
    "not no never nothing nobody none nor neither without hardly barely "
    "isn't aren't wasn't weren't don't doesn't didn't won't wouldn't can't cannot couldn't "
    "shouldn't isnt arent wasnt dont doesnt didnt wont cant couldnt shouldnt".split()
)
#: Words that make the next word's feeling stronger.
INTENSIFIERS = {
    "very": 1.4,
    "so": 1.3,
    "really": 1.3,
    "truly": 1.3,
    "extremely": 1.6,
    "utterly": 1.6,
    "absolutely": 1.5,
    "totally": 1.4,
    "completely": 1.4,
    "deeply": 1.4,
    "terribly": 1.5,
    "awfully": 1.4,
    "incredibly": 1.5,
    "most": 1.2,
    "too": 1.2,
}
#: How far back a negation reaches.
NEGATION_REACH = 3

_TOKEN = re.compile(r"[:;][-']?[()dDoOpP]|[^\W\d_]+(?:['’][^\W\d_]+)*|[^\w\s]", re.UNICODE)


def _stems(word: str) -> list[str]:
    """
    C{word} and what it may be an inflection of (crude English suffixes).
    """
    found = [word]
    for suffix, replacement in (
        ("ies", "y"),
        ("ied", "y"),
        ("ily", "y"),
        ("ing", ""),
        ("ing", "e"),
        ("ed", ""),
        ("ed", "e"),
        ("es", ""),
        ("s", ""),
        ("ly", ""),
        ("ness", ""),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            found.append(word[: -len(suffix)] + replacement)
    return found


def _index() -> dict[str, tuple[str, float]]:
    """
    Each word's strongest feeling (a word under two feelings goes to the
    one that weighs it more, ties to the one listed first).
    """
    index: dict[str, tuple[str, float]] = {}
    for feeling, words in LEXICON.items():
        for word, weight in words.items():
            if word not in index or weight > index[word][1]:
                index[word] = (feeling, weight)
    return index


_INDEX = _index()


@lru_cache(maxsize=16384)
def _lookup(word: str) -> tuple[str, float] | None:
    """A word's feeling and weight, as written or by its stem (words recur: kept)."""
    found = _INDEX.get(word)
    if found is not None:
        return found
    for stem in _stems(word)[1:]:
        found = _INDEX.get(stem)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Reading:
    """What one sentence says it feels."""

    feeling: str
    #: 0 (barely) to 1 (as strongly as words say it); 0 for neutral.
    intensity: float
    #: Every feeling's score, for the mood (L{feelings_mood}).
    scores: dict[str, float] = field(default_factory=dict)


def read(sentence: str) -> Reading:
    """
    The feeling C{sentence} says most strongly, how strongly, and every
    feeling's score.  Ties go to the feeling named first in L{FEELINGS}.
    """
    scores: dict[str, float] = {}
    tokens = [t.lower().replace("’", "'") for t in _TOKEN.findall(sentence)]
    negatedUntil = -1
    boost = 1.0
    for index, token in enumerate(tokens):
        if token in NEGATIONS:
            negatedUntil = index + NEGATION_REACH
            continue
        if token in INTENSIFIERS:
            boost = max(boost, INTENSIFIERS[token])
            continue
        symbol = SYMBOLS.get(token)
        found = (symbol, 1.5) if symbol is not None else _lookup(token)
        if found is None:
            continue
        feeling, weight = found
        weight *= boost
        boost = 1.0
        if index <= negatedUntil:
            # "not happy" is sad; "not afraid", "not angry" feel nothing.
            if feeling != "joy":
                continue
            feeling, weight = "sadness", weight * 0.6
        scores[feeling] = scores.get(feeling, 0.0) + weight
    exclamations = sentence.count("!")
    if exclamations:
        lift = 1.0 + 0.25 * min(exclamations, 3)
        scores = {k: v * lift for k, v in scores.items()}
        if "?" in sentence and "surprise" not in scores:
            scores["surprise"] = 0.8
    if not scores:
        return Reading(NEUTRAL, 0.0, {})
    feeling = max(FEELINGS[1:], key=lambda f: scores.get(f, 0.0))
    top = scores[feeling]
    intensity = min(1.0, 0.3 + 0.35 * top)
    return Reading(feeling, round(intensity, 2), scores)


__all__ = ["LEXICON", "Reading", "read"]
