"""OpenAI-compatible server: `quickdraft serve` (see app.py for routes, protocol.py for validation)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from quickdraft.decoding.registry import METHODS
from quickdraft.errors import QuickdraftError
from quickdraft.settings.options import ENGINE_OPTIONS, EngineConfig, options_from


@dataclass
class ServeConfig:
    """`quickdraft serve` settings: the server's own, plus the engine's options (the same names as the
    CLI and the bench: method, drafter, draft_length, ..., target, dtype, threads). A YAML file may
    set any of them; flags given explicitly win."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int | None = None  # None: sized by this host's free memory (server/admission.queue_size)
    max_batch: int | None = None  # None: fitted to the host (the measured batched cost surface)
    default_max_tokens: int = 256
    max_body_bytes: int = 4 * 1024 * 1024
    max_prompt_tokens: int | None = None  # None: what this host prefills in about a minute (measured at warm-up)

    def __post_init__(self) -> None:
        for name in ("port", "max_queue", "default_max_tokens", "max_body_bytes", "max_batch", "max_prompt_tokens"):
            value = getattr(self, name)
            if name in ("max_queue", "max_batch", "max_prompt_tokens") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "max_queue" else 1):
                raise QuickdraftError(f"serve setting {name} must be a positive integer, got {value!r}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, object], where: str = "") -> ServeConfig:
        """Split flat settings into the server's and the engine's (options.ENGINE_OPTIONS); refuse others."""
        own = {f.name for f in fields(cls)} - {"engine"}
        unknown = sorted(set(settings) - own - set(ENGINE_OPTIONS))
        if unknown:
            raise QuickdraftError(f"{where}unknown settings {unknown}; known: {sorted(own | set(ENGINE_OPTIONS))}")
        engine = options_from({k: v for k, v in settings.items() if k in ENGINE_OPTIONS}, where=where)
        return cls(engine=engine, **{k: v for k, v in settings.items() if k in own})


def load_config_file(path: str) -> dict:
    """The settings mapping of a YAML file (validated by `ServeConfig.from_settings`)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise QuickdraftError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise QuickdraftError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise QuickdraftError(f"{path}: expected a mapping of settings")
    ServeConfig.from_settings(data, where=f"{path}: ")  # unknown names refused here, naming the file
    return data


SERVER_SUFFIX_CACHE = 65536  # tokens of earlier requests' outputs the server's suffix drafter keeps


def engine_loader(cfg: ServeConfig):
    """A function that loads the engine (run in the background while /health says 503)."""
    from quickdraft.engine import Engine

    cache = SERVER_SUFFIX_CACHE if METHODS[cfg.engine.method].uses_drafter else 0  # drafts from earlier requests too
    return lambda: Engine.load(config=cfg.engine, suffix_cache=cache)


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    from quickdraft.server.app import create_app

    app = create_app(
        engine_loader(cfg),
        cfg.model_name,
        cfg.max_queue,
        cfg.default_max_tokens,
        cfg.max_body_bytes,
        cfg.max_batch,
        cfg.max_prompt_tokens,
    )
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="info")
