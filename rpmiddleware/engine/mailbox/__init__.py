"""
RPEngine's second transport, the file mailbox (file transport v1): a folder
RPEngine and the middleware exchange envelopes through, feeding the same
L{rpmiddleware.engine.link.EngineLink} the WebSocket does.

  - L{files<rpmiddleware.engine.mailbox.files>}: the folder and its files
    (checks, stems, atomic writes, bounded scans, clean-up); no protocol;
  - L{audioslots<rpmiddleware.engine.mailbox.audioslots>}: the WAV slots, and
    each phrase in one turned into the chunk stream the WebSocket carries;
  - L{session<rpmiddleware.engine.mailbox.session>}: an engine session over
    the mailbox, and the writer it writes through;
  - L{endpoint<rpmiddleware.engine.mailbox.endpoint>}: the mailbox's sessions
    and what only file mode has (acks removing files, slots renewed, a
    session adopted at start-up);
  - L{watch<rpmiddleware.engine.mailbox.watch>}: whether RPEngine still
    reads the folder;
  - L{service<rpmiddleware.engine.mailbox.service>}: the folder made ready,
    and polled, as a C{twisted.application} service.

Nothing outside the repository imports these modules (the plugin API is
L{rpmiddleware.plugin.base}), so the names they had before this package
(C{rpmiddleware.engine.mailboxservice}, ...) are not kept.
"""
