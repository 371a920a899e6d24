"""
Animation: what a game needs to animate a speaking character.

  - L{marks}: the C{speech-marks} plugin (when each sentence, word and mouth
    shape of a line is spoken, before the audio), with L{matching} (which
    text each speech segment says), L{kinds} (what a request asked for) and
    L{workers} (its threads);
  - L{alignment}: words and visemes placed on a sentence's audio;
  - L{feelings}: what the character feels while it speaks.

See docs/animation.md.
"""
