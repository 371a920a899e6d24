"""
Everything a plugin author imports, in one place.

A plugin is written against this module alone (C{from rpmiddleware.plugin
import ChainPlugin, Envelope, PluginFactory}); the built-in plugins in
C{plugins/} are, too, and C{tests/test_plugin_surface.py} guards exactly what
it exports.  What lies behind it (the packages C{protocol}, C{cards},
C{runtime}, C{audio}) may be reorganised; these names stay.  Tests import the
kit from L{rpmiddleware.testing} as well.

The names, by what they are for:

  - B{Writing a plugin}: L{ChainPlugin}, L{PluginFactory},
    L{PluginSettings} (a plugin's C{[plugins.NAME]} table, typed and
    checked), L{rejectUnknownSettings} (for a table read by hand),
    L{PluginNameError}; what a build function is given
    (L{PluginServices}); the interfaces a plugin implements or is handed
    (C{I...}; L{IPluginLifecycle}: attached to its chain, closed on stop).
  - B{Envelopes}: L{Envelope}, L{Direction}, L{isoTimestamp}; RPEngine's
    message types and fields (L{messages}, the module, and the groups of
    types used most: L{OPENING}, L{TERMINAL}, L{CANCELLING}, L{WITHDRAWING});
    the keys of C{envelope.meta} several parts read (L{meta}); what
    RPEngine gives clients about its queue (L{Capacity}); a request's
    timeline (L{Timeline}).
  - B{Talking to clients}: plugins' own client messages and C{x-} fields
    (L{toClient}, L{clientMessage}, L{answerOp}, L{startTurn},
    L{pluginFields}, ...), the client protocol's error codes
    (L{errorMessage}, L{CLIENT_CODES}, L{InvalidMessage}) and its field
    checks (L{clientfields}).
  - B{What RPEngine accepts and tells its model}: its rules
    (L{EngineRefusal}, L{checkPromptContext}, ...), its prompt assembly and
    token estimate (L{estimateTokens}, L{promptRequest}, ...), adding to a
    request's scene context (L{addSceneText}), and where its speech cuts
    a reply into sentences, one audio segment each (L{sentenceBlocks}),
    what a game asks of speech marks and how they travel (L{speechmarks}), and
    what of a reply the player heard from how much of its speech was
    played (L{Speech}, L{heardText}); the feelings a line may carry and
    where a game asks them from (L{FEELINGS}, L{FEELING_SOURCES}), and the
    envelope that tells a client one (L{FEELING_ENVELOPE}, L{FEELING_FIELDS}).
  - B{Cards}: L{validateCard}, L{CardHasher} (L{CardHasher.withData} is the
    sanctioned way to change what the model is told of a character),
    L{canonicalHash}, transfers and diffs.
  - B{Audio}: the light helpers (L{decodeBase64}, L{encodeBase64},
    L{base64Bytes}, L{endsSegment}, ...); the conversions in L{pcm} (numpy and soxr) are
    imported the first time C{rpmiddleware.plugin.pcm} is asked for, so a
    plugin imports them inside the function that first converts audio.
  - B{The reactor and the collector}: L{inLaterTurn}, L{hasTurns},
    L{importFrozen}.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from rpmiddleware.audio.format import (
    QUALITIES,
    AudioError,
    base64Bytes,
    canonicalFormat,
    decodeBase64,
    encodeBase64,
    endsSegment,
    exactLength,
)
from rpmiddleware.cards.canonical import knownPlainJson
from rpmiddleware.cards.diff import applyPatch, diff
from rpmiddleware.cards.hasher import OwnedDocument
from rpmiddleware.cards.validation import (
    CARD_FORMAT,
    CanonicalCard,
    CardHasher,
    InvalidCard,
    canonicalHash,
    snapshotTransfer,
    transferDocument,
    transferOperations,
    validateCard,
)
from rpmiddleware.plugin.base import (
    ChainPlugin,
    PluginFactory,
    PluginNameError,
    PluginSettings,
    rejectUnknownSettings,
)
from rpmiddleware.plugin.clientext import (
    FROM_CLIENT,
    START_TURN,
    TO_CLIENT,
    TURN_FAILED,
    TURN_PLAYED,
    answerOp,
    clientMessage,
    isPluginField,
    pluginFields,
    startTurn,
    toClient,
    unclaimedResult,
)
from rpmiddleware.plugin.interfaces import (
    IChainContext,
    IChainObserver,
    IClientExtension,
    IEngineSessionInfo,
    IEnvelopePlugin,
    IHeldWork,
    IMetricsSource,
    IPluginFactory,
    IPluginLifecycle,
    IPluginServices,
    IReplyStream,
    ITimingSource,
    ITool,
    IToolProvider,
)
from rpmiddleware.plugin.services import PluginServices
from rpmiddleware.protocol import clientfields, messages, meta, speechmarks
from rpmiddleware.protocol.clienterrors import (
    CLIENT_CODES,
    INTERNAL_ERROR,
    INVALID_MESSAGE,
    InvalidMessage,
    errorMessage,
)
from rpmiddleware.protocol.envelope import Direction, Envelope, isoTimestamp
from rpmiddleware.protocol.feelings import (
    FEELING_ENVELOPE,
    FEELING_FIELDS,
    FEELING_SOURCES,
    FEELINGS,
)
from rpmiddleware.protocol.messages import (
    CANCELLING,
    INPUT_AUDIO_FORMATS,
    INPUT_SAMPLE_RATE,
    MAX_INPUT_AUDIO_SECONDS,
    OPENING,
    OUTPUT_SAMPLE_RATE,
    TERMINAL,
    VOICES,
    WITHDRAWING,
    Capacity,
    textOfDelta,
)
from rpmiddleware.protocol.prompt import (
    estimateTokens,
    eventTokens,
    exampleMessages,
    limitOf,
    mandatoryBlocks,
    promptRequest,
    renderMacros,
    speakerKey,
    trimmed,
)
from rpmiddleware.protocol.promptcontext import AUTO_EVENT, addSceneText
from rpmiddleware.protocol.rules import (
    INTERACTION_MODES,
    MAX_RESPONSE_RULES,
    PROMPT_CONTEXT_FIELDS,
    EngineRefusal,
    checkPromptContext,
)
from rpmiddleware.protocol.sentences import sentenceBlocks
from rpmiddleware.protocol.speech import Speech, heardText
from rpmiddleware.protocol.timeline import Timeline
from rpmiddleware.runtime.collector import importFrozen
from rpmiddleware.runtime.reactorturn import hasTurns, inLaterTurn

if TYPE_CHECKING:
    from rpmiddleware.audio import pcm

#: Modules reached through this one but imported only when first asked for,
#: because importing them costs (numpy, soxr): C{rpmiddleware.plugin.pcm}.
LAZY = {"pcm": "rpmiddleware.audio.pcm"}


def __getattr__(name: str) -> Any:
    """
    The modules of L{LAZY}, imported the first time they are asked for
    (C{from rpmiddleware.plugin import pcm} inside a function).
    """
    if name in LAZY:
        return import_module(LAZY[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTO_EVENT",
    "CANCELLING",
    "CARD_FORMAT",
    "CLIENT_CODES",
    "FEELINGS",
    "FEELING_ENVELOPE",
    "FEELING_FIELDS",
    "FEELING_SOURCES",
    "FROM_CLIENT",
    "INPUT_AUDIO_FORMATS",
    "INPUT_SAMPLE_RATE",
    "INTERACTION_MODES",
    "INTERNAL_ERROR",
    "INVALID_MESSAGE",
    "MAX_INPUT_AUDIO_SECONDS",
    "MAX_RESPONSE_RULES",
    "OPENING",
    "OUTPUT_SAMPLE_RATE",
    "PROMPT_CONTEXT_FIELDS",
    "QUALITIES",
    "START_TURN",
    "TERMINAL",
    "TO_CLIENT",
    "TURN_FAILED",
    "TURN_PLAYED",
    "VOICES",
    "WITHDRAWING",
    "AudioError",
    "CanonicalCard",
    "Capacity",
    "CardHasher",
    "ChainPlugin",
    "Direction",
    "EngineRefusal",
    "Envelope",
    "IChainContext",
    "IChainObserver",
    "IClientExtension",
    "IEngineSessionInfo",
    "IEnvelopePlugin",
    "IHeldWork",
    "IMetricsSource",
    "IPluginFactory",
    "IPluginLifecycle",
    "IPluginServices",
    "IReplyStream",
    "ITimingSource",
    "ITool",
    "IToolProvider",
    "InvalidCard",
    "InvalidMessage",
    "OwnedDocument",
    "PluginFactory",
    "PluginNameError",
    "PluginServices",
    "PluginSettings",
    "Timeline",
    "addSceneText",
    "answerOp",
    "applyPatch",
    "base64Bytes",
    "canonicalFormat",
    "canonicalHash",
    "checkPromptContext",
    "clientMessage",
    "clientfields",
    "decodeBase64",
    "diff",
    "encodeBase64",
    "endsSegment",
    "exactLength",
    "errorMessage",
    "estimateTokens",
    "eventTokens",
    "exampleMessages",
    "hasTurns",
    "importFrozen",
    "inLaterTurn",
    "isPluginField",
    "isoTimestamp",
    "knownPlainJson",
    "limitOf",
    "mandatoryBlocks",
    "messages",
    "meta",
    "pcm",
    "pluginFields",
    "promptRequest",
    "rejectUnknownSettings",
    "renderMacros",
    "sentenceBlocks",
    "Speech",
    "heardText",
    "snapshotTransfer",
    "speakerKey",
    "speechmarks",
    "startTurn",
    "textOfDelta",
    "toClient",
    "transferDocument",
    "transferOperations",
    "trimmed",
    "unclaimedResult",
    "validateCard",
]
