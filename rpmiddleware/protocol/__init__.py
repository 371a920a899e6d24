"""
What the two protocols say, in one place: RPEngine's v3 envelope
(C{envelope}), its message types and fields (C{messages}), what it refuses
(C{rules}), what it gives its model (C{prompt}, C{promptcontext}); the
voice-client protocol's error codes and field checks (C{clienterrors},
C{clientfields}); the C{meta} keys
several parts read; a request's timeline (C{timeline}); and the schema
checks both use (C{schema}).
"""
