"""OpenAI-compatible server: `quickdraft serve` (see app.py for routes, protocol.py for validation)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from quickdraft.errors import QuickdraftError


@dataclass
class ServeConfig:
    """`quickdraft serve` settings; a YAML file may set any of them (flags given explicitly win).

    Method and drafter use the same names as the CLI and the benchmark (drafter spec strings go
    through the drafter registry, so new drafters need no server change)."""

    target: str | None = None
    dtype: str = "bfloat16"
    threads: int | None = None
    method: str = "sd"
    drafter: str = "ngram"
    draft_length: int = 4
    draft_schedule: str = "fixed"
    confidence_threshold: float = 0.4
    model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = 8
    default_max_tokens: int = 256
    max_body_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("port", "max_queue", "default_max_tokens", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "max_queue" else 1):
                raise QuickdraftError(f"serve setting {name} must be a positive integer, got {value!r}")


def load_config_file(path: str) -> dict:
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
    known = {f.name for f in fields(ServeConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise QuickdraftError(f"{path}: unknown settings {unknown}; known: {sorted(known)}")
    return data


def engine_loader(cfg: ServeConfig):
    from quickdraft.config import DraftConfig
    from quickdraft.engine import Engine, EngineConfig

    draft = DraftConfig(cfg.draft_length, cfg.draft_schedule, cfg.confidence_threshold)
    engine_cfg = EngineConfig(method=cfg.method, drafter=cfg.drafter, draft=draft)  # validates names now
    return lambda: Engine.load(cfg.target, engine_cfg, cfg.dtype, cfg.threads)


def serve(cfg: ServeConfig) -> None:
    import uvicorn

    from quickdraft.server.app import create_app

    app = create_app(engine_loader(cfg), cfg.model_name, cfg.max_queue, cfg.default_max_tokens, cfg.max_body_bytes)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="info")
