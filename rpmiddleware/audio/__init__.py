"""
Audio: what needs nothing heavy (C{format}: PCM format names, strict
base64, WAV headers, a segment's last chunk), and decoding, encoding and
resampling (C{pcm}: numpy and soxr, imported where audio is first converted).
"""
