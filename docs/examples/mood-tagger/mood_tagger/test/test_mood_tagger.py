# mood_tagger/test/test_mood_tagger.py
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from mood_tagger import moodTagger
from rpmiddleware.testing import PluginHarness, pluginServices


class MoodTaggerTests(SynchronousTestCase):
    def setUp(self) -> None:
        clock = Clock()
        self.services = pluginServices(clock)
        plugin = moodTagger.buildPlugin({"loud": "thrilled"}, self.services)
        self.harness = PluginHarness(plugin, clock)
        self.harness.startSession()

    def reply(self, line: str) -> dict[str, object]:
        """The player says C{line}; RPEngine's reply comes back through the chain."""
        self.harness.toEngine(self.harness.replyRequest("r1", text=line))
        self.harness.toGame("reply.text.completed", requestId="r1", text="Hm.", tokenCount=2)
        return self.harness.sentToGame[-1].fields

    def test_loudLine(self) -> None:
        self.assertEqual(self.reply("A dragon!")["x-mood"], "thrilled")

    def test_quietLine(self) -> None:
        completed = self.reply("Any work going?")
        self.assertEqual(completed["x-mood"], "calm")
        self.assertEqual(self.harness.typesToEngine(), ["reply.request"])

    def test_notedOnTheTimeline(self) -> None:
        self.reply("Hello.")
        entry = self.services.timeline.get("r1")
        assert entry is not None
        self.assertEqual(entry.details["mood"], "calm")

    def test_forgottenAtTheEnd(self) -> None:
        self.reply("Hello.")
        self.harness.toGame("reply.completed", requestId="r1", modalities=["text"])
        self.harness.toGame("reply.text.completed", requestId="r1", text="again")
        self.assertNotIn("x-mood", self.harness.sentToGame[-1].fields)

    def test_unknownSettingRefused(self) -> None:
        with self.assertRaises(ValueError) as caught:
            moodTagger.buildPlugin({"lowd": "angry"}, self.services)
        self.assertIn("unknown setting 'lowd' for plugin mood-tagger", str(caught.exception))
