# twisted/plugins/mood_tagger_plugin.py
from mood_tagger import moodTagger

__all__ = ["moodTagger"]
