"""
The one face plugin authors import from: C{rpmiddleware.plugin}.

It exports exactly the names below, each of them real, and the built-in
plugins import nothing else of rpmiddleware, so a plugin written against the
guide can do what the built-ins do.
"""

from __future__ import annotations

import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

import rpmiddleware.plugin as face
from tests.support.imports import importGraph

#: What the face exports, by what it is for (its docstring names the groups).
EXPECTED = {
    # Writing a plugin.
    "ChainPlugin",
    "PluginFactory",
    "PluginNameError",
    "PluginServices",
    "PluginSettings",
    "rejectUnknownSettings",
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
    # Envelopes.
    "Envelope",
    "Direction",
    "isoTimestamp",
    "messages",
    "meta",
    "OPENING",
    "TERMINAL",
    "CANCELLING",
    "WITHDRAWING",
    "INPUT_AUDIO_FORMATS",
    "INPUT_SAMPLE_RATE",
    "MAX_INPUT_AUDIO_SECONDS",
    "OUTPUT_SAMPLE_RATE",
    "VOICES",
    "Capacity",
    "textOfDelta",
    "Timeline",
    # Talking to clients.
    "FROM_CLIENT",
    "TO_CLIENT",
    "START_TURN",
    "TURN_FAILED",
    "TURN_PLAYED",
    "toClient",
    "clientMessage",
    "answerOp",
    "startTurn",
    "unclaimedResult",
    "isPluginField",
    "pluginFields",
    "errorMessage",
    "CLIENT_CODES",
    "INTERNAL_ERROR",
    "INVALID_MESSAGE",
    "InvalidMessage",
    "clientfields",
    # What RPEngine accepts and tells its model.
    "EngineRefusal",
    "checkPromptContext",
    "INTERACTION_MODES",
    "MAX_RESPONSE_RULES",
    "PROMPT_CONTEXT_FIELDS",
    "estimateTokens",
    "eventTokens",
    "exampleMessages",
    "limitOf",
    "mandatoryBlocks",
    "promptRequest",
    "renderMacros",
    "speakerKey",
    "trimmed",
    "AUTO_EVENT",
    "addSceneText",
    "sentenceBlocks",
    "speechmarks",
    "Speech",
    "heardText",
    "FEELINGS",
    "FEELING_ENVELOPE",
    "FEELING_FIELDS",
    "FEELING_SOURCES",
    # Cards.
    "CARD_FORMAT",
    "CanonicalCard",
    "CardHasher",
    "InvalidCard",
    "OwnedDocument",
    "canonicalHash",
    "knownPlainJson",
    "snapshotTransfer",
    "transferDocument",
    "transferOperations",
    "validateCard",
    "applyPatch",
    "diff",
    # Audio.
    "AudioError",
    "QUALITIES",
    "canonicalFormat",
    "decodeBase64",
    "encodeBase64",
    "endsSegment",
    "exactLength",
    "base64Bytes",
    "pcm",
    # The reactor and the collector.
    "hasTurns",
    "inLaterTurn",
    "importFrozen",
}


class SurfaceTests(SynchronousTestCase):
    def test_exportsExactly(self) -> None:
        """
        C{__all__} is exactly the expected names: adding or removing one is
        a change to what plugin authors may rely on, made here on purpose.
        """
        self.assertEqual(set(face.__all__), EXPECTED)
        self.assertEqual(len(face.__all__), len(EXPECTED), "a name is listed twice")

    def test_everyNameResolves(self) -> None:
        """
        Every exported name is there (C{pcm} is imported when asked for).
        """
        missing = [name for name in face.__all__ if getattr(face, name, None) is None]
        self.assertEqual(missing, [])

    def test_unknownNameRefused(self) -> None:
        with self.assertRaises(AttributeError):
            face.noSuchThing  # noqa: B018

    def test_pcmIsLazy(self) -> None:
        """
        Importing the face imports neither numpy nor soxr; asking for C{pcm}
        does.
        """
        code = (
            "import sys, rpmiddleware.plugin as p\n"
            "before = 'numpy' in sys.modules or 'soxr' in sys.modules\n"
            "p.pcm.toMono\n"
            "print(before, 'soxr' in sys.modules)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        self.assertEqual(out, ["False", "True"])

    def test_builtinsUseOnlyTheFace(self) -> None:
        """
        The built-in plugins import, of rpmiddleware, only the face and
        their own package: what they do, a third-party plugin can do.
        """
        modules, graph = importGraph()
        found = [
            f"{name} imports {target}"
            for name in sorted(modules)
            if name.startswith("rpmiddleware.builtin")
            for target in sorted(graph[name])
            if target != "rpmiddleware.plugin" and not target.startswith("rpmiddleware.builtin")
        ]
        self.assertEqual(found, [], "\n".join(found))
