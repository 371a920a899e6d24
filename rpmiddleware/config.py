"""
Settings: defaults, the TOML file, and the checks that refuse a bad one early.

Every problem is a L{ConfigError} whose message names the file and the
setting, because the person reading it is a game developer at a terminal.
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

PRODUCTION_ORIGIN = "https://rpengine.gemtavern.com"
DEVELOPMENT_ORIGIN = "http://127.0.0.1:5173"
DEFAULT_PORT = 38471
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class ConfigError(ValueError):
    """
    The configuration cannot be used; the message says why and where.
    """


@dataclass
class ServerSettings:
    port: int = DEFAULT_PORT
    interface: str = "127.0.0.1"
    dev: bool = False
    #: Extra browser origins allowed on /rp-engine/socket.
    origins: list[str] = field(default_factory=list)
    #: Browser origins allowed on /client/socket (clients without Origin always are).
    client_origins: list[str] = field(default_factory=list)
    server_version: str = ""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    hello_timeout: float = 5.0
    #: Connections per endpoint beyond which upgrades are refused with 503.
    max_connections: int = 64

    def engineOrigins(self) -> frozenset[str]:
        allowed = {PRODUCTION_ORIGIN, *self.origins}
        if self.dev:
            allowed.add(DEVELOPMENT_ORIGIN)
        return frozenset(o.rstrip("/").lower() for o in allowed)

    def publicLink(self) -> str:
        return f"{PRODUCTION_ORIGIN}/#port={self.port}"


@dataclass
class EngineSettings:
    ack_timeout: float = 5.0
    max_retransmits: int = 3
    dedup_window: int = 4096
    waiting_limit: int = 64
    ack_engine_messages: bool = False


@dataclass
class GameSettings:
    integration_id: str = "rpmiddleware"
    #: Path to the Character Card V2 JSON used when a client names none.
    default_character: str = ""
    default_character_id: str = "default"


@dataclass
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    game: GameSettings = field(default_factory=GameSettings)
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


_SECTIONS = {"server": ServerSettings, "engine": EngineSettings, "game": GameSettings}


def _fill(target: Any, table: Mapping[str, Any], where: str, source: str) -> None:
    known = {f.name: f for f in fields(target)}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            options = ", ".join(sorted(known))
            raise ConfigError(f"{source}: unknown setting {where}.{key} (known: {options})")
        default = getattr(target, name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, list):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ConfigError(f"{source}: {where}.{key} must be {_kind(default)}, got {value!r}")
        setattr(target, name, value)


def _kind(default: Any) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, int):
        return "a whole number"
    if isinstance(default, list):
        return "a list of strings"
    return "a string"


def parseSettings(document: Mapping[str, Any], source: str = "<memory>") -> Settings:
    """
    Settings from an already parsed TOML document.
    """
    settings = Settings(source=source)
    for key, value in document.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{key}] must be a table")
            _fill(getattr(settings, key), value, key, source)
        elif key == "chain":
            settings.chain = _parseChain(value, source)
        elif key == "plugins":
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                raise ConfigError(f"{source}: [plugins.NAME] entries must be tables")
            settings.plugins = {name: dict(table) for name, table in value.items()}
        else:
            raise ConfigError(
                f"{source}: unknown section [{key}] (known: server, engine, game, chain, plugins)"
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
