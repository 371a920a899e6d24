"""
Settings: defaults, the TOML file, and the checks that refuse a bad one early.

Every problem is a L{ConfigError} whose message names the file and the
setting, because the person reading it is a game developer at a terminal.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import msgspec
import msgspec.structs

from rpmiddleware.protocol.messages import MAX_MESSAGE_BYTES, SPEECH_OUTPUT_LANGUAGES, VOICES
from rpmiddleware.protocol.schema import TOML_WORDS, SchemaError, conform

PRODUCTION_ORIGIN = "https://rpengine.gemtavern.com"
#: RPEngine's other production host name; its own mock game admits it
#: (tools/mock-game/server.mjs allowedOrigins).
ALTERNATE_PRODUCTION_ORIGIN = "https://rp-engine.gemtavern.com"
#: Output sample rates a client may ask for (the audio-resample plugin's range).
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
DEVELOPMENT_ORIGIN = "http://127.0.0.1:5173"
DEFAULT_PORT = 38471


class ConfigError(ValueError):
    """
    The configuration cannot be used; the message says why and where.
    """


class Section(msgspec.Struct, forbid_unknown_fields=True):
    """
    A section of the TOML file (C{[server]}, ...): its schema, read with
    L{parseSettings}.  A key it does not name is refused; a whole number
    is taken where a number is asked for, a boolean never for a number.
    """


class ServerSettings(Section):
    port: int = DEFAULT_PORT
    interface: str = "127.0.0.1"
    dev: bool = False
    #: Extra browser origins allowed on /rp-engine/socket.
    origins: list[str] = msgspec.field(default_factory=list)
    #: Browser origins allowed on /client/socket (clients without Origin always are).
    client_origins: list[str] = msgspec.field(default_factory=list)
    server_version: str = ""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    hello_timeout: float = 5.0
    #: Connections per endpoint beyond which upgrades are refused with 503.
    max_connections: int = 64

    def engineOrigins(self) -> frozenset[str]:
        allowed = {PRODUCTION_ORIGIN, ALTERNATE_PRODUCTION_ORIGIN, *self.origins}
        if self.dev:
            allowed.add(DEVELOPMENT_ORIGIN)
        return frozenset(o.rstrip("/").lower() for o in allowed)

    def publicLink(self) -> str:
        return f"{PRODUCTION_ORIGIN}/#port={self.port}"


class EngineSettings(Section):
    ack_timeout: float = 5.0
    max_retransmits: int = 3
    dedup_window: int = 4096
    waiting_limit: int = 64
    ack_engine_messages: bool = False
    #: RPEngine's file mailbox (file transport v1): the folder to serve it
    #: in, beside the WebSocket; empty for none.  See docs/engine-endpoint.md.
    mailbox: str = ""
    #: WAV slots RPEngine may fill per peer identity (RPEngine's own game
    #: side makes 2048).
    mailbox_audio_slots: int = 2048
    #: Wake on inotify as well as polling, where the platform has it.
    mailbox_watch: bool = True


class GameSettings(Section):
    integration_id: str = "rpmiddleware"
    #: Path to the Character Card V2 JSON used when a client names none.
    default_character: str = ""
    default_character_id: str = "default"


class ClientSettings(Section):
    """
    How the client endpoint behaves; see C{docs/client-protocol.md}; the C{[client]} section.
    """

    #: STUN/TURN servers sent in C{ready} (objects with urls, username?, credential?).
    ice_servers: list[dict[str, Any]] = msgspec.field(default_factory=list)
    #: Seconds a disconnected client's session (and history) is kept for C{reconnect}.
    session_ttl: float = 1800.0
    #: Disconnected sessions kept at most; the oldest expire first beyond it.
    max_sessions: int = 1024
    #: Conversation entries (player turns and character replies) kept per session.
    history_limit: int = 200
    #: A new turn while one is playing cancels the old one (else it waits).
    barge_in: bool = True
    #: Turns a client may have waiting behind a playing one when barge-in is off.
    queued_turns: int = 4
    #: Output defaults until a client sends C{configure}.
    default_sample_rate: int = 24000
    default_voice: str = "F1"
    default_language: str = "en"
    streaming: bool = True
    #: Seconds a turn may wait for RPEngine to accept it (no RPEngine, or busy)
    #: before it is cancelled with LLM_TIMEOUT; 0 waits for ever.
    accept_timeout: float = 300.0
    #: Seconds RPEngine may send nothing for a turn it is working on (its
    #: active request: see rpmiddleware.engine.queue) before the turn is
    #: cancelled upstream with LLM_TIMEOUT; queued turns are not timed; 0
    #: waits for ever.  60 s: a slow GPU's first token for a long card (the
    #: prompt's prefill) and a long recording's transcription take seconds
    #: to tens of seconds; a minute is well past both.
    stall_timeout: float = 60.0
    #: Bytes queued for a client beyond which it counts as not reading: its
    #: audio stops and its turn is cancelled upstream.
    send_buffer_soft: int = 2 * 1024 * 1024
    #: Bytes queued for a client beyond which it is closed with 1008 at once.
    send_buffer_hard: int = 8 * 1024 * 1024
    #: Seconds a client may stay over the soft bound before it is closed with 1008.
    slow_client_grace: float = 10.0
    #: Attachments kept for the next turn at most (older ones are dropped, and said so).
    max_attachments: int = 8

    def check(self, source: str = "<defaults>") -> None:
        """
        Refuse settings that cannot work, naming the setting.
        """

        def fail(name: str, why: str) -> ConfigError:
            return ConfigError(f"{source}: client.{name} {why}")

        if not MIN_SAMPLE_RATE <= self.default_sample_rate <= MAX_SAMPLE_RATE:
            raise fail(
                "default_sample_rate",
                f"must be from {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE}",
            )
        if self.default_voice not in VOICES:
            raise fail("default_voice", "must be one of F1-F5, M1-M5")
        if self.default_language not in SPEECH_OUTPUT_LANGUAGES:
            raise fail("default_language", "must be a speech-output language of RPEngine")
        for name in ("session_ttl", "accept_timeout", "stall_timeout", "slow_client_grace"):
            if getattr(self, name) < 0:
                raise fail(name, "must not be negative")
        for name in ("max_sessions", "history_limit", "queued_turns", "max_attachments"):
            if getattr(self, name) < 0:
                raise fail(name, "must not be negative")
        if not 0 < self.send_buffer_soft <= self.send_buffer_hard:
            raise fail("send_buffer_soft", "must be positive and at most send_buffer_hard")
        for i, server in enumerate(self.ice_servers):
            if not isinstance(server, dict) or not isinstance(server.get("urls"), str | list):
                raise fail(f"ice_servers[{i}]", "must be a table with urls")


#: webrtcvad accepts 10, 20 or 30 ms frames.
FRAME_MS_CHOICES = (10, 20, 30)


@dataclass
class VadSettings:
    """
    The voice detector's settings (C{rpmiddleware.webrtc.vad}), read from
    the C{[webrtc]} section; see C{docs/webrtc.md}.
    """

    aggressiveness: int = 2
    frame_ms: int = 20
    start_ms: int = 100
    hangover_ms: int = 600
    pre_roll_ms: int = 200
    trail_ms: int = 100
    max_seconds: float = 30.0

    def check(self) -> None:
        """
        @raise ValueError: naming the setting that cannot work.
        """
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError("vad_aggressiveness must be 0, 1, 2 or 3")
        if self.frame_ms not in FRAME_MS_CHOICES:
            raise ValueError("vad_frame_ms must be 10, 20 or 30")
        for name in ("start_ms", "hangover_ms", "pre_roll_ms", "trail_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"vad_{name} must not be negative")
        if self.trail_ms > self.hangover_ms:
            raise ValueError("vad_trail_ms must not exceed vad_hangover_ms")
        if not 1.0 <= self.max_seconds <= 30.0:
            raise ValueError("vad_max_seconds must be from 1 to 30 (RPEngine's limit)")

    def frames(self, ms: int) -> int:
        """
        A duration in whole frames (rounded up, at least one for C{ms > 0}).
        """
        return -(-ms // self.frame_ms)


class WebRTCSettings(Section):
    """
    WebRTC for voice clients (the C{webrtc} extra); the C{[webrtc]} section.
    See C{docs/webrtc.md}.
    """

    #: Serve WebRTC when the extra is installed (and pick the asyncio reactor for it).
    enabled: bool = True
    #: The voice detector's aggressiveness: 0 (most sound counts as speech) to 3.
    vad_aggressiveness: int = 2
    #: Speech must last this long before speech-start (shorter sounds are ignored).
    vad_start_ms: int = 100
    #: Silence this long ends speech (speech-end, and the turn is sent).
    vad_hangover_ms: int = 600
    #: Audio kept from before speech-start, so the first syllable is not cut.
    vad_pre_roll_ms: int = 200
    #: Audio kept after the last speech frame (at most the hangover).
    vad_trail_ms: int = 100
    #: An utterance ends at this length (RPEngine takes at most 30 s).
    vad_max_seconds: float = 30.0
    #: Bytes queued on a data channel beyond which the client counts as not reading it.
    data_channel_backlog: int = 8 * 1024 * 1024

    def vad(self) -> VadSettings:
        """
        The detector's settings.
        """
        return VadSettings(
            aggressiveness=self.vad_aggressiveness,
            start_ms=self.vad_start_ms,
            hangover_ms=self.vad_hangover_ms,
            pre_roll_ms=self.vad_pre_roll_ms,
            trail_ms=self.vad_trail_ms,
            max_seconds=self.vad_max_seconds,
        )

    def check(self, source: str = "<defaults>") -> None:
        try:
            self.vad().check()
        except ValueError as e:
            raise ConfigError(f"{source}: webrtc.{e}")
        if self.data_channel_backlog < 64 * 1024:
            raise ConfigError(f"{source}: webrtc.data_channel_backlog must be at least 65536")


@dataclass
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    game: GameSettings = field(default_factory=GameSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    webrtc: WebRTCSettings = field(default_factory=WebRTCSettings)
    #: Plugin name -> priority (lower sits nearer the game); None disables.
    chain: dict[str, int | None] = field(default_factory=dict)
    #: Plugin name -> that plugin's own table.
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Where the settings came from, for messages and relative paths.
    source: str = "<defaults>"

    def pluginSettings(self, name: str) -> Mapping[str, Any]:
        return self.plugins.get(name, {})

    def relativePath(self, value: str) -> Path:
        path = Path(value).expanduser()
        if not path.is_absolute() and self.source not in ("<defaults>", ""):
            path = Path(self.source).parent / path
        return path


_SECTIONS: dict[str, type[Section]] = {
    "server": ServerSettings,
    "engine": EngineSettings,
    "game": GameSettings,
    "client": ClientSettings,
    "webrtc": WebRTCSettings,
}


S = TypeVar("S", bound=msgspec.Struct)

_ENUM = "invalid enum value "


def readSection(schema: type[S], table: Mapping[str, Any], where: str) -> S:
    """
    A table of the file read with its schema (a C{msgspec.Struct} that
    forbids unknown fields: a L{Section}, or a plugin's
    L{rpmiddleware.plugin.base.PluginSettings}): the core's sections, and a
    plugin's C{[plugins.NAME]} through its factory
    (L{rpmiddleware.plugin.base.PluginFactory}).  Keys may be written with
    C{-} for C{_}.  A check the schema makes in C{__post_init__} raises
    C{ValueError} with a message that starts with the setting's name.

    @param where: the table's name in the file (C{server},
        C{plugins.memory}), which every message starts the key with.
    @raise ValueError: naming the key as the file wrote it, below C{where}
        (the caller adds the file).
    """
    written = {key.replace("-", "_"): key for key in table}
    try:
        return conform({name: table[key] for name, key in written.items()}, schema, TOML_WORDS)
    except SchemaError as e:
        problem = e.problem
        if not problem.field:
            # A check of the schema's own (__post_init__) names the setting.
            raise ValueError(f"{where}.{problem.problem}") from None
        name = problem.field.partition("[")[0].partition(".")[0]
        field = written.get(name, name) + problem.field[len(name) :]
        if problem.kind == "unknown":
            known = ", ".join(sorted(schema.__struct_fields__)) or "none"
            raise ValueError(f"unknown setting {where}.{field} (known: {known})") from None
        why = problem.problem
        if why.startswith(_ENUM):
            choices = _choices(schema, name)
            if choices:
                why = f"must be one of {choices}, got {why.removeprefix(_ENUM)}"
        shown = f" ({table[field]!r})" if problem.kind == "type" and field in table else ""
        raise ValueError(f"{where}.{field} {why}{shown}") from None


def _choices(schema: type[msgspec.Struct], name: str) -> str:
    """
    The values a C{Literal} field takes, for a message (empty when it is
    not one).
    """
    for info in msgspec.structs.fields(schema):
        if info.name == name and get_origin(info.type) is Literal:
            return ", ".join(repr(v) if v == "" else str(v) for v in get_args(info.type))
    return ""


def _section(schema: type[Section], table: Mapping[str, Any], where: str, source: str) -> Section:
    """
    L{readSection}, for a section of the file at C{source}.

    @raise ConfigError: naming the file, the section and the key as the file wrote it.
    """
    try:
        return readSection(schema, table, where)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None


def parseSettings(document: Mapping[str, Any], source: str = "<memory>") -> Settings:
    """
    Settings from an already parsed TOML document.
    """
    settings = Settings(source=source)
    for key, value in document.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{key}] must be a table")
            setattr(settings, key, _section(_SECTIONS[key], value, key, source))
        elif key == "chain":
            settings.chain = _parseChain(value, source)
        elif key == "plugins":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(f"{source}: [plugins.NAME] entries must be tables")
            settings.plugins = {name: dict(table) for name, table in value.items()}
        else:
            raise ConfigError(
                f"{source}: unknown section [{key}] (known: server, engine, game, client, webrtc, "
                "chain, plugins)"
            )
    check(settings)
    return settings


def _parseChain(value: Any, source: str) -> dict[str, int | None]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [chain] must be a table")
    unknown = set(value) - {"plugins", "order"}
    if unknown:
        raise ConfigError(f"{source}: unknown setting chain.{sorted(unknown)[0]}")
    chain: dict[str, int | None] = {}
    order = value.get("order")
    if order is not None:
        if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
            raise ConfigError(f"{source}: chain.order must be a list of plugin names")
        for position, name in enumerate(order):
            chain[name] = (position + 1) * 100
    priorities = value.get("plugins", {})
    if not isinstance(priorities, dict):
        raise ConfigError(
            f"{source}: chain.plugins must be a table of name = priority (or false to disable)"
        )
    for name, priority in priorities.items():
        if priority is False:
            chain[name] = None
        elif isinstance(priority, int) and not isinstance(priority, bool):
            chain[name] = priority
        else:
            raise ConfigError(
                f"{source}: chain.plugins.{name} must be a whole number or false, got {priority!r}"
            )
    return chain


def loadSettings(path: str | Path) -> Settings:
    """
    Read a TOML configuration file.
    """
    source = str(path)
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {source} does not exist")
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {source}: {e.strerror}")
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source} is not valid TOML: {e}")
    return parseSettings(document, source)


def isLoopback(interface: str) -> bool:
    if interface == "localhost":
        return True
    try:
        return ipaddress.ip_address(interface.strip("[]")).is_loopback
    except ValueError:
        return False


def check(settings: Settings) -> None:
    """
    Refuse settings that would be unsafe or cannot work.
    """
    server, source = settings.server, settings.source
    if not isLoopback(server.interface):
        raise ConfigError(
            f"{source}: server.interface is {server.interface!r}; rpmiddleware listens on the "
            "loopback interface only (127.0.0.1 or ::1), because RPEngine and the game run on "
            "this machine and nothing else should reach them"
        )
    if not 0 <= server.port <= 65535:
        raise ConfigError(f"{source}: server.port must be between 0 and 65535")
    if not 1024 <= server.max_message_bytes <= MAX_MESSAGE_BYTES:
        raise ConfigError(
            f"{source}: server.max_message_bytes must be between 1024 and {MAX_MESSAGE_BYTES} "
            "(the protocol's 8 MiB limit)"
        )
    for origin in [*server.origins, *server.client_origins]:
        if "://" not in origin or origin.endswith("*"):
            raise ConfigError(
                f"{source}: origin {origin!r} must be a full origin such as "
                "http://127.0.0.1:5173 (no wildcards)"
            )
    for name, value in (
        ("server.hello_timeout", server.hello_timeout),
        ("engine.ack_timeout", settings.engine.ack_timeout),
    ):
        if value <= 0:
            raise ConfigError(f"{source}: {name} must be positive")
    if settings.engine.waiting_limit < 0 or settings.engine.dedup_window < 1:
        raise ConfigError(f"{source}: engine.waiting_limit and engine.dedup_window are too small")
    if not 1 <= settings.engine.mailbox_audio_slots <= 65536:
        raise ConfigError(f"{source}: engine.mailbox_audio_slots must be from 1 to 65536")
    settings.client.check(source)
    settings.webrtc.check(source)
