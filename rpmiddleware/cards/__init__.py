"""
Character cards as RPEngine reads them: validation of Character Card V2
(C{validation}), RPEngine's canonical JSON (C{canonical}), the hash every
request names (C{hasher}), and bounded RFC 6902 diffs for the card cache
(C{diff}).
"""
